"""The activities write only as the run that holds the stack, and a stack held by a run that
has closed is recovered (or handed to the same workflow's new run after a reset).

Temporal's answer about the holding run comes from a fake oracle; the activities run in
temporalio's ActivityEnvironment, so the calling run is the environment's info.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from stackflow.activities import WorkerActivities
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import Resource, ResourceType
from stackflow.runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StackLock, StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.temporal.activity_io import NodeInput, PhaseInput, PrepareInput
from stackflow.temporal.operation import OperationInput

SPEC = {"resources": [{"id": "a", "type": "OnPrem", "attributes": {"v": 1}}]}
STACK = StackRef("p", "w")


class CountingRuntime(Runtime):
    type_name = "OnPrem"

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return None

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        self.applied.append(resource.id)
        return dict(resource.attributes)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        pass


class FakeOracle:
    """Says how the holding run ended (None: still running) and records who was asked."""

    def __init__(self, ended: str | None) -> None:
        self.answer = ended
        self.asked: list[StackLock] = []

    async def ended(self, lock: StackLock) -> str | None:
        self.asked.append(lock)
        return self.answer

    def link(self, run: RunRef) -> str:
        return f"http://ui/{run.workflow_id}/{run.run_id}"


def env(workflow_id: str, run_id: str) -> ActivityEnvironment:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, workflow_id=workflow_id, workflow_run_id=run_id
    )
    return environment


def activities(backend: StateBackend, oracle: FakeOracle) -> tuple[WorkerActivities, Any]:
    runtime = CountingRuntime()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    return WorkerActivities.create(
        registry, backend, PriorStateCache(None, backend), oracle
    ), runtime


def prepare(workflow_id: str, run_id: str) -> PrepareInput:
    request = OperationInput(project="p", workspace="w", spec=SPEC, auto_approve=True)
    return PrepareInput(operation="apply", request=request, workflow_id=workflow_id, run_id=run_id)


def node(spec_ref: str | None, revision: int) -> NodeInput:
    return NodeInput(
        project="p",
        workspace="w",
        revision=revision,
        spec_ref=spec_ref,
        resource_id="a",
        action="Create",
    )


async def test_prepare_refuses_while_the_holder_runs(backend: StateBackend) -> None:
    holder = RunRef("apply-p-w", "r1")
    backend.create(STACK, Operation.apply, None, run=holder)
    oracle = FakeOracle(None)
    acts, _ = activities(backend, oracle)
    with pytest.raises(ApplicationError) as info:
        await env("other", "r9").run(acts.prepare.prepare_operation, prepare("other", "r9"))
    assert info.value.type == "StackLocked" and info.value.non_retryable
    assert "still running" in str(info.value) and "http://ui/apply-p-w/r1" in str(info.value)
    assert [lock.holder() for lock in oracle.asked] == [holder]
    assert backend.revisions(STACK) == [1]
    assert backend.lock(STACK).holder() == holder  # type: ignore[union-attr]


async def test_prepare_recovers_a_stack_whose_holder_ended(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, None, run=RunRef("apply-p-w", "r1"))
    acts, _ = activities(backend, FakeOracle("run r1 of workflow apply-p-w was terminated"))
    plan = await env("apply-p-w-2", "r2").run(
        acts.prepare.prepare_operation, prepare("apply-p-w-2", "r2")
    )
    assert plan.revision == 2
    old = backend.get(STACK, 1)
    assert old.phase is Phase.failed
    assert (
        old.error == "run r1 of workflow apply-p-w was terminated; recovered by the next operation"
    )
    assert backend.lock(STACK).holder() == RunRef("apply-p-w-2", "r2")  # type: ignore[union-attr]


async def test_prepare_retried_by_the_same_run_reopens_its_release(backend: StateBackend) -> None:
    oracle = FakeOracle(None)
    acts, _ = activities(backend, oracle)
    first = await env("wf", "r1").run(acts.prepare.prepare_operation, prepare("wf", "r1"))
    again = await env("wf", "r1").run(acts.prepare.prepare_operation, prepare("wf", "r1"))
    assert first.revision == again.revision == 1
    assert backend.revisions(STACK) == [1] and oracle.asked == []


async def test_a_run_that_lost_the_stack_changes_nothing(backend: StateBackend) -> None:
    acts, runtime = activities(backend, FakeOracle(None))
    plan = await env("wf", "r1").run(acts.prepare.prepare_operation, prepare("wf", "r1"))
    backend.unlock(STACK, "unlocked by hand")  # e.g. `stackflow release unlock --force`
    with pytest.raises(ApplicationError) as info:
        await env("wf", "r1").run(acts.walk.apply_resource, node(plan.spec_ref, 1))
    assert info.value.type == "Fenced" and info.value.non_retryable
    assert runtime.applied == []  # refused before the runtime was called
    assert backend.get(STACK, 1).state.resources == []
    with pytest.raises(ApplicationError) as phase:
        await env("other", "r9").run(
            acts.walk.set_phase,
            PhaseInput(project="p", workspace="w", revision=1, phase="succeeded"),
        )
    assert phase.value.type == "PhaseConflictError"
    assert backend.phase_of(STACK, 1) is Phase.failed


async def test_the_new_run_of_a_reset_takes_the_stack_over(backend: StateBackend) -> None:
    oracle = FakeOracle("run r1 of workflow wf was reset")
    acts, runtime = activities(backend, oracle)
    plan = await env("wf", "r1").run(acts.prepare.prepare_operation, prepare("wf", "r1"))
    # the reset's new run continues the same release: its writes take the stack over
    await env("wf", "r2").run(acts.walk.apply_resource, node(plan.spec_ref, 1))
    assert runtime.applied == ["a"]
    assert backend.lock(STACK).holder() == RunRef("wf", "r2")  # type: ignore[union-attr]
    assert backend.get(STACK, 1).state.resources == [
        Resource(id="a", type=ResourceType.OnPrem, attributes={"v": 1})
    ]
    await env("wf", "r2").run(
        acts.walk.set_phase, PhaseInput(project="p", workspace="w", revision=1, phase="succeeded")
    )
    assert backend.phase_of(STACK, 1) is Phase.succeeded and backend.lock(STACK) is None


async def test_another_workflow_never_takes_the_stack_over(backend: StateBackend) -> None:
    oracle = FakeOracle("run r1 of workflow wf was terminated")
    acts, runtime = activities(backend, oracle)
    plan = await env("wf", "r1").run(acts.prepare.prepare_operation, prepare("wf", "r1"))
    with pytest.raises(ApplicationError) as info:
        await env("intruder", "r2").run(acts.walk.apply_resource, node(plan.spec_ref, 1))
    assert info.value.type == "Fenced"
    assert runtime.applied == [] and oracle.asked == []
    assert backend.lock(STACK).holder() == RunRef("wf", "r1")  # type: ignore[union-attr]
