"""Every activity failure leaves classified (activities.errors): invalid input and conflicts
are never retried, unavailable infrastructure is retried until the run's
unavailable_timeout, an unexpected exception at most BUG_ATTEMPTS times; and what the apply
activity records before a readiness wait."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from stackflow.activities import WorkerActivities
from stackflow.activities.errors import BUG_ATTEMPTS, temporal_errors, to_application_error
from stackflow.core.errors import (
    BackendUnavailableError,
    FencedError,
    SpecError,
    StackflowError,
    StackLockedError,
)
from stackflow.core.refs import RunRef, StackRef
from stackflow.runtimes.base import (
    Attributes,
    Conflict,
    InvalidInput,
    OwnedElsewhere,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.temporal.activity_io import NodeInput, PrepareInput
from stackflow.temporal.operation import OperationInput


def in_activity(attempt: int = 1, first_scheduled_ago: float = 0.0) -> ActivityEnvironment:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info,
        attempt=attempt,
        scheduled_time=datetime.now(UTC) - timedelta(seconds=first_scheduled_ago),
    )
    return environment


def classify(exc: Exception, *, attempt: int = 1, ago: float = 0.0, timeout: float = 600) -> Any:
    def body() -> None:
        with temporal_errors(timeout):
            raise exc

    with pytest.raises(ApplicationError) as caught:
        in_activity(attempt, ago).run(body)
    return caught.value


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (InvalidInput("a: .spec.replicas: expected numeric", resource_id="a"), "InvalidInput"),
        (Conflict("a: exists as a Directory"), "Conflict"),
        (OwnedElsewhere("a: /srv/x is owned by stack p/w"), "OwnedElsewhere"),
        (SpecError("spec.yaml: line 3: duplicate key"), "SpecError"),
        (FencedError("write refused"), "Fenced"),
        (StackLockedError("stack p/w is locked"), "StackLocked"),
    ],
)
def test_invalid_input_and_conflicts_are_never_retried(exc: Exception, kind: str) -> None:
    error = classify(exc)
    assert (error.type, error.non_retryable, error.message) == (kind, True, str(exc))


def test_unavailable_is_retried_until_the_runs_timeout_then_says_for_how_long() -> None:
    early = classify(Unavailable("cluster 10.0.0.1:6443 unreachable"), ago=5, timeout=30)
    assert (early.type, early.non_retryable) == ("Unavailable", False)
    late = classify(Unavailable("cluster 10.0.0.1:6443 unreachable"), ago=31, timeout=30)
    assert (late.type, late.non_retryable) == ("Unreachable", True)
    assert "10.0.0.1:6443 unreachable (unreachable for 31s" in late.message
    assert "unavailable_timeout of 30s" in late.message
    backend = classify(BackendUnavailableError("state backend down"), ago=700)
    assert (backend.type, backend.non_retryable) == ("Unreachable", True)


def test_a_bug_gets_a_few_attempts_then_stops_with_its_traceback() -> None:
    first = classify(KeyError("x"), attempt=1)
    assert (first.type, first.non_retryable) == ("Bug", False)
    assert first.message == "internal error: KeyError: 'x'"
    last = classify(KeyError("x"), attempt=BUG_ATTEMPTS)
    assert (last.type, last.non_retryable) == ("InternalError", True)
    assert "after 3 attempts" in last.message
    assert "Traceback" in last.details[0] and "KeyError" in last.details[0]


def test_application_errors_pass_as_they_are() -> None:
    mine = ApplicationError("already classified", type="Custom", non_retryable=True)
    assert to_application_error(mine) is mine


class NeverReady(Runtime):
    type_name = "OnPrem"

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return None

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        return {**resource.attributes, "status": "created"}

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        pass

    async def wait_ready(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        raise Unavailable(f"{resource.id} is not ready", resource_id=resource.id)


async def test_watch_records_the_object_before_waiting_and_keeps_reference_edges(
    backend: StateBackend,
) -> None:
    registry = RuntimeRegistry()
    registry.register("OnPrem", NeverReady)
    acts = WorkerActivities.create(registry, backend, PriorStateCache(None, backend))
    spec = {
        "resources": [
            {"id": "a", "type": "OnPrem", "attributes": {"v": 1}},
            {"id": "b", "type": "OnPrem", "attributes": {"from_a": "$kusion_path.a.v"}},
        ]
    }
    request = OperationInput(project="p", workspace="w", spec=spec, auto_approve=True)
    plan = await acts.prepare.prepare_operation(
        PrepareInput(operation="apply", request=request, workflow_id="wf", run_id="r1")
    )
    owner = RunRef(workflow_id="wf", run_id="r1")
    for rid, watch in (("a", False), ("b", True)):
        node = NodeInput(
            project="p",
            workspace="w",
            revision=plan.revision or 0,
            spec_ref=plan.spec_ref,
            resource_id=rid,
            action="Create",
            watch=watch,
            owner=owner,
        )
        if not watch:
            await acts.walk.apply_resource(node)
            continue
        with pytest.raises(ApplicationError, match="b is not ready"):
            await acts.walk.apply_resource(node)
    state = backend.resources(StackRef("p", "w"), plan.revision or 0)
    assert state["b"].attributes == {"from_a": 1, "status": "created"}  # recorded, not vanished
    assert state["b"].depends_on == ["a"]  # the $kusion_path edge: destroy deletes b first


@pytest.mark.parametrize("error_type", ["StackLocked", "OwnedElsewhere"])
def test_what_another_run_or_stack_holds_exits_3(error_type: str) -> None:
    from stackflow.cli import report

    assert report.workflow_failure("apply", "held", error_type).exit_code == 3
    with pytest.raises(StackflowError) as raised:
        report.raise_failure({"phase": "failed", "error": "held", "error_type": error_type})
    assert raised.value.exit_code == 3
    assert report.workflow_failure("apply", "x", "Conflict").exit_code == 2
