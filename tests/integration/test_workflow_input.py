"""Malformed input from any Temporal client fails the run at once, never hangs.

Runs are started as other services start them: a plain Temporal client (no stackflow data
converter: plain ``json/plain`` payloads) and the ``temporal`` CLI, each on the stack's own
workflow id. Every malformed input ends the run FAILED within seconds with one line naming
the field; the history has no failed workflow task (a workflow task that fails is retried
forever, the run stuck open under the stack's id); no release is opened and nothing is
locked; and the same stack applies right after. Malformed Update arguments are rejected by
the update's validator, the run unharmed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, FailureError

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import ApprovalInput, OperationResult, StatusView, workflow_id_for
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import file_resource, new_project, releases, wait_phase

FAIL_WITHIN = 10.0
"""Seconds a malformed run may take to end (it used to stay RUNNING for good)."""


@dataclass
class Case:
    name: str
    workflow: str
    args: list[Any]
    """One value per workflow argument (JSON, or a raw payload)."""
    names: str
    """What the error line must say (the field, or what is wrong)."""
    error_type: str = "InvalidInput"
    cli: bool = False
    """Started with `temporal workflow start` (else a plain SDK client)."""
    meta: tuple[str, ...] = ()
    """`--input-meta` of the CLI."""
    decodes: bool = True
    """The arguments decode (as JSON); else the data converter refuses them before any
    workflow code runs."""


def cases(project: str, spec: dict[str, Any]) -> list[Case]:
    stack = {"project": project, "workspace": "dev"}
    return [
        Case("project-a-number", "ApplyWorkflow", [{"project": 5, "workspace": "dev"}], "project"),
        Case("no-project", "ApplyWorkflow", [{"workspace": "dev", "spec": spec}], "project"),
        Case("a-list", "ApplyWorkflow", [[1, 2]], "expected a JSON object"),
        Case("a-string", "ApplyWorkflow", ["apply it"], "expected a JSON object"),
        Case("null", "ApplyWorkflow", [None], "got null"),
        Case("unknown-field", "ApplyWorkflow", [{**stack, "specs": spec}], "specs"),
        Case("spec-not-an-object", "ApplyWorkflow", [{**stack, "spec": "not a dict"}], "spec"),
        Case(
            "huge-project",
            "ApplyWorkflow",
            [{"project": "a" * 100_000, "workspace": "dev", "spec": spec}],
            "project",
        ),
        Case(
            "huge-spec-ref",
            "ApplyWorkflow",
            [{**stack, "spec_ref": "sha256:" + "f" * 100_000}],
            "spec_ref",
        ),
        Case("two-arguments", "ApplyWorkflow", [{**stack, "spec": spec}, {}], "one argument"),
        Case("no-argument", "ApplyWorkflow", [], "one argument"),
        Case(
            "resources-not-a-list",
            "ApplyWorkflow",
            [{**stack, "spec": {"resources": "web"}}],
            "resources",
            error_type="SpecError",
        ),
        Case(
            "approval-wait-past-timers",
            "ApplyWorkflow",
            [{**stack, "spec": spec, "approval_timeout_seconds": 1e300}],
            "approval_timeout_seconds",
        ),
        Case("preview-concurrency", "PreviewWorkflow", [{**stack, "max_concurrency": "x"}], "max"),
        Case("destroy-a-list", "DestroyWorkflow", [[stack]], "expected a JSON object"),
        Case("rollback-to-latest", "RollbackWorkflow", [{**stack, "to_revision": "l"}], "to_rev"),
        Case("refresh-targets", "RefreshWorkflow", [{**stack, "targets": "web"}], "targets"),
        Case("drift-with-spec", "DriftWorkflow", [{**stack, "spec": spec}], "spec"),
        Case("batch-internal", "BatchWorkflow", [stack], "revision"),
        # exactly as `temporal workflow start --input …` sends them
        Case("cli-project-a-number", "ApplyWorkflow", [{"project": 5}], "project", cli=True),
        Case(
            "cli-spec-not-an-object",
            "ApplyWorkflow",
            [{**stack, "spec": "not a dict"}],
            "spec",
            cli=True,
        ),
        Case("cli-a-list", "ApplyWorkflow", [[1, 2]], "expected a JSON object", cli=True),
        Case("cli-two-inputs", "DestroyWorkflow", [stack, stack], "one argument", cli=True),
        Case("cli-no-input", "RefreshWorkflow", [], "one argument", cli=True),
        # payloads that are not JSON: an encoding of the client's own, a protobuf message
        # this worker does not know, bytes that are not JSON, a compressed payload that is not
        Case(
            "cli-unknown-encoding",
            "ApplyWorkflow",
            [stack],
            "argument 1 cannot be decoded (encoding 'acme/custom')",
            cli=True,
            meta=("encoding=acme/custom",),
            decodes=False,
        ),
        Case(
            "cli-protobuf",
            "DestroyWorkflow",
            [stack],
            "Unknown Protobuf type acme.v1.Input",
            cli=True,
            meta=("encoding=json/protobuf", "messageType=acme.v1.Input"),
            decodes=False,
        ),
        Case(
            "cli-nested-too-deep",
            "ApplyWorkflow",
            [{**stack, "spec": {"resources": [], "x": json.loads("[" * 300 + "]" * 300)}}],
            "recursion limit exceeded",
            cli=True,
            decodes=False,
        ),
        Case(
            "not-json",
            "ApplyWorkflow",
            [RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{project: x"))],
            "Invalid JSON",
            decodes=False,
        ),
        Case(
            "not-zlib",
            "PreviewWorkflow",
            [RawValue(Payload(metadata={"encoding": b"binary/zlib"}, data=b"\x78garbage"))],
            "encoding 'binary/zlib'",
            decodes=False,
        ),
    ]


def workflow_id(project: str, workflow: str) -> str:
    """The stack's own id (a drift check's own id for DriftWorkflow)."""
    wid = workflow_id_for(StackRef(project, "dev"))
    return wid + "/drift" if workflow == "DriftWorkflow" else wid


def chain(err: BaseException | None) -> list[tuple[str, str]]:
    """(type, message) of a failure and its causes."""
    out = []
    while err is not None:
        if isinstance(err, ApplicationError):
            out.append((err.type or "", err.message))
        elif isinstance(err, FailureError):
            out.append((type(err).__name__, err.message))
        else:
            out.append((type(err).__name__, str(err)))
        err = err.__cause__
    return out


async def event_types(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [event.event_type async for event in handle.fetch_history_events()]


@pytest.fixture
async def plain_client(temporal_address: str) -> Client:
    """A Temporal client with the SDK's default data converter: plain JSON payloads, as
    other services (and `temporal workflow start`) send them."""
    return await Client.connect(
        temporal_address, namespace=os.environ.get("TEMPORAL_NAMESPACE", "default")
    )


def cli_start(env: dict[str, str], case: Case, wid: str) -> None:
    temporal = shutil.which("temporal", path=env.get("PATH"))
    assert temporal, 'the Temporal CLI is not on PATH: eval "$(make -s env)"'
    command = [
        temporal,
        "--address",
        env["TEMPORAL_ADDRESS"],
        "workflow",
        "start",
        "--task-queue",
        env["STACKFLOW_TASK_QUEUE"],
        "--type",
        case.workflow,
        "--workflow-id",
        wid,
        "--id-conflict-policy",
        "Fail",
    ]
    for meta in case.meta:
        command += ["--input-meta", meta]
    for arg in case.args:
        command += ["--input", json.dumps(arg)]
    started = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert started.returncode == 0, started.stdout + started.stderr


async def test_malformed_inputs_fail_the_run_at_once(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    plain_client: Client,
    temporal_client: Client,
) -> None:
    project = new_project()
    target = tmp_path / "app.conf"
    spec = {"resources": [file_resource(target, "hello\n")]}
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    took: dict[str, float] = {}
    for case in cases(project, spec):
        wid = workflow_id(project, case.workflow)
        began = time.monotonic()
        if case.cli:
            cli_start(stack_env, case, wid)
        else:
            await plain_client.start_workflow(
                case.workflow, args=case.args, id=wid, task_queue=queue
            )
        # read through stackflow's converter: the worker encrypts what it writes
        handle = temporal_client.get_workflow_handle(wid)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), FAIL_WITHIN)
        took[case.name] = time.monotonic() - began
        errors = chain(failed.value.cause)
        # the workflow's own error, or the failed activity's
        kind, line = next(e for e in errors if e[0] != "ActivityError")
        assert kind == case.error_type, f"{case.name}: {errors}"
        assert case.names in line and "\n" not in line and len(line) <= 400, (case.name, line)
        if case.error_type == "InvalidInput":
            prefix = "invalid workflow input: " if case.decodes else "invalid input: "
            assert line.startswith(prefix), (case.name, line)
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.FAILED, case.name
        events = await event_types(handle)
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events, case.name
        if case.error_type == "InvalidInput":  # refused in workflow code, before any activity
            assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events, case.name
            if case.decodes and case.workflow != "BatchWorkflow":  # `stackflow status` says why
                status = await handle.query("status", result_type=StatusView)
                assert (status.phase, status.error) == ("failed", line), case.name
    assert max(took.values()) < FAIL_WITHIN, took

    backend = releases(stack_env)
    try:
        assert backend.revisions(StackRef(project, "dev")) == []
        assert backend.lock(StackRef(project, "dev")) is None
        assert not [s for s in backend.stacks() if s.project.startswith("aaaa")]
    finally:
        backend.close()

    # the stack is free: the same id applies, and malformed approvals are refused by the
    # update's validator while the run waits, unharmed
    wid = workflow_id_for(StackRef(project, "dev"))
    await plain_client.start_workflow(
        "ApplyWorkflow",
        {"project": project, "workspace": "dev", "spec": spec},
        id=wid,
        task_queue=queue,
    )
    handle = temporal_client.get_workflow_handle(wid, result_type=OperationResult)
    await wait_phase(handle, "awaitingApproval")
    plain = plain_client.get_workflow_handle(wid)
    for args, names in (
        ([{"by": 5}], "invalid update input: by: Input should be a valid string (got 5)"),
        (["alice"], "invalid update input: expected a JSON object"),
        ([{"by": "x"}, {"by": "y"}], "invalid update input: expected one argument"),
        ([{"by": "x", "reason": ["no"]}], "invalid update input: reason: "),
        (
            [RawValue(Payload(metadata={"encoding": b"acme/custom"}, data=b"{}"))],
            "invalid input: argument 1 cannot be decoded",
        ),
    ):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await plain.execute_update("approve", args=args)
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.message.startswith(names), refused.value.cause.message
    # queries take no argument: one given anyway does not disturb the run
    status = await handle.query("status", {"verbose": 5}, result_type=StatusView)
    assert status.phase == "awaitingApproval"
    answer = await handle.execute_update("approve", ApprovalInput(by="ann"))
    assert answer == "approved by ann"
    result = await asyncio.wait_for(handle.result(), 120)
    assert result.phase == "succeeded" and result.revision == 1
    assert target.read_text() == "hello\n"
    events = await event_types(handle)
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
    backend = releases(stack_env)
    try:
        [release] = backend.list(StackRef(project, "dev"))
        assert release.revision == 1 and release.phase == "succeeded"
        assert release.approval is not None and release.approval.by == "ann"
    finally:
        backend.close()
