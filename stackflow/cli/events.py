"""`stackflow events`: a run's event stream (what ``GET …/runs/{run_id}/events`` serves), and
the ``--output ndjson`` of the run commands: the same lines, header first, in both modes (the
API with ``STACKFLOW_API_URL``, else the state backend and Temporal directly)."""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from typing import Annotated, Any

import typer

from stackflow.cli.api_mode import api_client, api_mode
from stackflow.cli.app import app
from stackflow.cli.event_lines import Item, Sink, is_header, ndjson_sink, stream_api, write_line
from stackflow.cli.options import ProjectOpt, WaitOpt, WorkspaceOpt
from stackflow.core.errors import NotFoundError
from stackflow.core.refs import RunRef, StackRef
from stackflow.core.terminal import one_line_safe
from stackflow.model.events import EventType, RunEvent, StreamHeader
from stackflow.temporal.operation import drift_workflow_id, preview_workflow_id, workflow_id_for


class EventsOutput(StrEnum):
    table = "table"
    json = "json"
    ndjson = "ndjson"


def candidate_ids(stack: StackRef) -> list[str]:
    """Every workflow id a run of the stack can have (as the API lists them)."""
    return [workflow_id_for(stack), preview_workflow_id(stack), drift_workflow_id(stack)]


def describe(event: RunEvent) -> str:
    """What one event says, for a person."""
    d: dict[str, Any] = event.data
    resource = (d.get("resource") or {}).get("id", "")
    action = d.get("action", "")
    match event.type:
        case EventType.run_start:
            by = f" by {d['requested_by']}" if d.get("requested_by") else ""
            rev = f"revision {d['revision']}, " if d.get("revision") is not None else ""
            return f"{d.get('operation', 'run')}{by}: {rev}{d.get('total', 0)} node(s)"
        case EventType.phase:
            return f"phase {d.get('phase')}"
        case EventType.planned_change:
            return f"{action} {resource}" + (" (drift)" if d.get("drift") else "")
        case EventType.change_summary:
            return (
                f"{d.get('add', 0)} to add, {d.get('change', 0)} to change, "
                f"{d.get('remove', 0)} to remove, {d.get('unchanged', 0)} unchanged"
            )
        case EventType.approval_wait:
            what = (
                "approval (approve / reject)"
                if d.get("wait") == "approval"
                else ("a decision on failed nodes (retry / abort)")
            )
            return f"waiting for {what}"
        case EventType.apply_start:
            return f"{action} {resource}"
        case EventType.apply_complete:
            return f"{action} {resource} done ({d.get('elapsed_seconds')}s)"
        case EventType.apply_errored:
            return f"{action} {resource} failed: {d.get('error')}"
        case EventType.run_complete:
            rev = f" (release {d['revision']})" if d.get("revision") is not None else ""
            error = f": {d['error']}" if d.get("error") else ""
            return f"{d.get('status')}{rev}{error}"
    return json.dumps(d, sort_keys=True)


def human_line(event: RunEvent) -> str:
    when = event.time.astimezone().strftime("%H:%M:%S")
    return one_line_safe(f"{event.seq:>5} {when} {event.type!s:<15} {describe(event)}")


class Collect:
    """``--output json``: one document at the end, ``{"stream": header, "events": [...]}``."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []

    def __call__(self, item: Item) -> None:
        if is_header(item):
            self.header = json.loads(item.line())
        else:
            self.events.append(item.wire())

    def dump(self) -> None:
        data = {"stream": self.header, "events": self.events}
        write_line(json.dumps(data, indent=2, ensure_ascii=False))


def table_sink(item: Item) -> None:
    if is_header(item):
        write_line(one_line_safe(f"run {item.run_id} of {item.project}/{item.workspace}"))
    else:
        write_line(human_line(item))


# ---- through the API -----------------------------------------------------------------------
def api_events(stack: StackRef, run_id: str | None, after: int, wait: bool, sink: Sink) -> None:
    with api_client() as client:
        if run_id is None:
            page = client.list_runs(stack, page_size=1)
            if not page.runs:
                raise NotFoundError(f"stack {stack} has no runs")
            run_id = page.runs[0].run_id
        stream_api(client, stack, run_id, after, wait, sink)


# ---- directly: the state backend and Temporal ----------------------------------------------
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
    from stackflow.core.config import default_backend
    from stackflow.state.event_follow import follow, temporal_ending

    sink(StreamHeader(project=stack.project, workspace=stack.workspace, **run.model_dump()))
    backend = default_backend()
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


@app.command()
def events(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    run: Annotated[
        str | None, typer.Option("--run", help="Run id (default: the stack's newest run).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Wait for new events until the run completes.")
    ] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Only events after this seq.")] = 0,
    output: Annotated[
        EventsOutput,
        typer.Option(
            "--output",
            "-o",
            help="table (a line per event), ndjson (the stream's lines, header first) or json.",
        ),
    ] = EventsOutput.table,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """A run's events (run_start, phase, planned_change, change_summary, approval_wait,
    apply_start, apply_complete, apply_errored, run_complete), as the API streams them."""
    stack = StackRef(project, workspace)
    collect = Collect()
    sinks: dict[EventsOutput, Sink] = {
        EventsOutput.ndjson: ndjson_sink,
        EventsOutput.table: table_sink,
        EventsOutput.json: collect,
    }
    sink = sinks[output]
    if api_mode():
        api_events(stack, run, after, follow, sink)
    else:
        asyncio.run(direct_events(stack, run, after, follow, unavailable_timeout, sink))
    if output == EventsOutput.json:
        collect.dump()
