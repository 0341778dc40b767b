"""Helpers for the operation-workflow integration tests (specs, polling, releases, replay)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from stackflow.core.refs import StackRef
from stackflow.model.release import Release
from stackflow.state.backend import StateBackend, open_backend
from stackflow.temporal.codec import data_converter
from stackflow.temporal.operation import StatusView
from stackflow.workflows.catalog import ALL_WORKFLOWS

T = TypeVar("T")

# What only the CLI used directly needs (Temporal, the state backend, the keys): a machine
# with these unset reaches stackflow through the API alone.
DIRECT_ONLY = (
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "STACKFLOW_STATE_URL",
    "STACKFLOW_POSTGRES_URL",
    "STACKFLOW_ENCRYPTION_KEY",
    "STACKFLOW_ENCRYPTION_KEY_FILE",
    "STACKFLOW_TASK_QUEUE",
)


@contextlib.asynccontextmanager
async def local_worker(
    client: Client, env: dict[str, str], workflows: Sequence[type], prefix: str
) -> AsyncIterator[tuple[str, StateBackend]]:
    """A worker in this process (workflow classes as given, unsandboxed so a test can patch
    module constants) with the real activities on the stack's state backend: its task queue
    and that backend."""
    import stackflow.worker.main as worker_module

    backend = open_backend(env["STACKFLOW_STATE_URL"], migrate=True)
    activities = worker_module.build_activities(None, backend=backend)
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=list(workflows),
            activities=activities.all(),
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            yield queue, backend
    finally:
        await activities.registry.close()
        backend.close()


def new_project() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def file_resource(path: Path, content: str, deps: list[str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "id": f"onprem:File:{path}",
        "type": "OnPrem",
        "attributes": {"kind": "File", "path": str(path), "mode": "0644", "content": content},
    }
    if deps:
        res["dependsOn"] = deps
    return res


def dir_resource(path: Path, deps: list[str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "id": f"onprem:Directory:{path}",
        "type": "OnPrem",
        "attributes": {"kind": "Directory", "path": str(path), "mode": "0755"},
    }
    if deps:
        res["dependsOn"] = deps
    return res


def write_spec(path: Path, resources: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"resources": resources}, sort_keys=False))
    return path


def releases(env: dict[str, str]) -> StateBackend:
    """The state backend the test's workers and CLI share (STACKFLOW_STATE_URL)."""
    return open_backend(env["STACKFLOW_STATE_URL"])


def all_releases(env: dict[str, str], project: str, workspace: str = "default") -> list[Release]:
    backend = releases(env)
    try:
        return backend.list(StackRef(project, workspace), with_state=True)
    finally:
        backend.close()


def payload_json(payload: Any) -> Any:
    """A history payload as JSON, decoded by stackflow's codec (compressed, encrypted)."""
    return asyncio.run(payload_json_async(payload))


async def payload_json_async(payload: Any) -> Any:
    from stackflow.temporal.codec import payload_codec

    [plain] = await payload_codec().decode([payload])
    return json.loads(plain.data)


async def start_run(
    client: Client,
    env: dict[str, str],
    request: Any,
    *,
    workflow: str = "ApplyWorkflow",
    workflow_id: str | None = None,
    queue: str | None = None,
) -> WorkflowHandle[Any, Any]:
    """Start an operation workflow as any Temporal client would (default id, test queue)."""
    from stackflow.temporal.operation import OperationResult, workflow_id_for

    return await client.start_workflow(
        workflow,
        request,
        id=workflow_id or workflow_id_for(request.stack),
        task_queue=queue or env["STACKFLOW_TASK_QUEUE"],
        result_type=OperationResult,
    )


async def scheduled_ids(handle: WorkflowHandle[Any, Any], activity_type: str) -> list[str]:
    """Resource ids of the ``activity_type`` activities the run scheduled, in order; for
    ``apply_resource``/``delete_resource`` also the nodes of ``run_group`` activities (ready
    nodes of cheap runtimes share one) that apply or delete."""
    deleting = activity_type == "delete_resource"
    ids = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            name = attrs.activity_type.name
            if name == activity_type:
                ids.append((await payload_json_async(attrs.input.payloads[0]))["resource_id"])
            elif name == "run_group" and activity_type in ("apply_resource", "delete_resource"):
                group = await payload_json_async(attrs.input.payloads[0])
                ids += [rid for rid, action in group["nodes"] if (action == "Delete") == deleting]
    return ids


def expect_exit(
    proc: subprocess.CompletedProcess[str], code: int = 0
) -> subprocess.CompletedProcess[str]:
    """``proc``, once it exited with ``code`` (else fail showing its output)."""
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def cli_json(proc: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"not JSON (exit {proc.returncode}): {exc}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        ) from None


async def poll(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, interval: float = 0.2
) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except Exception as exc:  # the workflow may not have run its first task yet
            last = exc
        else:
            if last:
                return last  # type: ignore[no-any-return]
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


async def wait_phase(
    handle: WorkflowHandle[Any, Any], phase: str, timeout: float = 60
) -> StatusView:
    async def probe() -> StatusView | None:
        status = await handle.query("status", result_type=StatusView)
        return status if status.phase == phase else None

    return await poll(probe, timeout=timeout, what=f"phase {phase} of {handle.id}")


async def closed_runs(client: Client, project: str) -> list[tuple[str, str]]:
    """(workflow id, run id) of every closed run (children included) of a project's stacks."""
    query = f'WorkflowId STARTS_WITH "stackflow/{project}/" AND ExecutionStatus != "Running"'
    return sorted([(e.id, e.run_id) async for e in client.list_workflows(query)])


async def assert_histories_replay(client: Client, project: str, at_least: int) -> int:
    """Replay every closed workflow run of this project; returns how many were replayed.

    Visibility is eventually consistent, so this waits until ``at_least`` runs are listed.
    """

    async def probe() -> list[tuple[str, str]] | None:
        runs = await closed_runs(client, project)
        return runs if len(runs) >= at_least else None

    runs = await poll(probe, timeout=30, what=f"{at_least} closed runs of {project}")
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=data_converter())
    count = 0
    for workflow_id, run_id in runs:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        history = await handle.fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (
            f"history of {workflow_id} ({run_id}) does not replay: {result.replay_failure!r}"
        )
        count += 1
    return count
