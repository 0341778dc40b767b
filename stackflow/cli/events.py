"""`stackflow events` directly (``STACKFLOW_API_URL`` unset): a run's event stream from the
state backend, Temporal saying whether a run that wrote no ``run_complete`` has closed. The
command itself, and its lines in both modes, are :mod:`stackflow.cli.verbs`' and
:mod:`stackflow.cli.event_lines`'."""

from __future__ import annotations

from typing import Any

from stackflow.cli.event_lines import Sink
from stackflow.core.errors import NotFoundError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import StreamHeader
from stackflow.temporal.operation import drift_workflow_id, preview_workflow_id, workflow_id_for


def candidate_ids(stack: StackRef) -> list[str]:
    """Every workflow id a run of the stack can have (as the API lists them)."""
    return [workflow_id_for(stack), preview_workflow_id(stack), drift_workflow_id(stack)]


async def find_run(client: Any, stack: StackRef, run_id: str | None) -> RunRef:
    """The stack's run ``run_id``, or its newest (running first, as the API lists them)."""
    from temporalio.service import RPCError, RPCStatusCode

    if run_id is None:
        ids = ", ".join(f"'{wid}'" for wid in candidate_ids(stack))
        async for execution in client.list_workflows(f"WorkflowId IN ({ids})", limit=1):
            return RunRef(execution.id, execution.run_id)
        raise NotFoundError(f"stack {stack} has no runs")
    for wid in candidate_ids(stack):
        try:
            await client.get_workflow_handle(wid, run_id=run_id).describe()
        except RPCError as exc:
            if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                continue
            raise
        return RunRef(wid, run_id)
    raise NotFoundError(f"stack {stack} has no run {run_id}")


async def stream_direct(
    client: Any, stack: StackRef, run: RunRef, after: int, wait: bool, sink: Sink
) -> None:
    """The run's lines from the state backend into ``sink``, header first (Temporal says
    whether a run that wrote no ``run_complete`` has closed)."""
    from stackflow.state.backend import open_backend
    from stackflow.state.event_follow import follow, temporal_ending

    sink(StreamHeader(project=stack.project, workspace=stack.workspace, **run.model_dump()))
    backend = open_backend()
    try:
        events = follow(
            backend, stack, run, lambda: temporal_ending(client, run), after=after, wait=wait
        )
        async for event in events:
            if event is not None:
                sink(event)
    finally:
        backend.close()


async def direct_events(
    stack: StackRef, run_id: str | None, after: int, wait: bool, timeout: float, sink: Sink
) -> None:
    from stackflow.cli.connection import Temporal

    temporal = Temporal(timeout, stack)
    client = await temporal.connect()
    run = await temporal.call("find the run", lambda: find_run(client, stack, run_id))
    await stream_direct(client, stack, run, after, wait, sink)
