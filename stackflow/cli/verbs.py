"""The commands of :data:`stackflow.cli.table.COMMANDS`, once for both ways in (the typer app,
or `stackflow` parsing the table itself): each takes its options by name and goes through
the HTTP API (``STACKFLOW_API_URL``: :mod:`stackflow.cli.remote`, standard library only) or
to Temporal directly (:mod:`stackflow.cli.operations`, :mod:`stackflow.cli.steer`, imported
only then)."""

from __future__ import annotations

from typing import Any

from stackflow.cli.api_mode import api_mode
from stackflow.cli.output import echo_safe

Options = dict[str, Any]


def _run(workflow: str, o: Options) -> None:
    if api_mode():
        from stackflow.cli.remote import run

        run(workflow, o)
        return
    from stackflow.cli.operations import run_direct

    run_direct(workflow, o)


def preview(o: Options) -> None:
    _run("PreviewWorkflow", o)


def apply(o: Options) -> None:
    _run("ApplyWorkflow", o)


def destroy(o: Options) -> None:
    _run("DestroyWorkflow", o)


def rollback(o: Options) -> None:
    _run("RollbackWorkflow", o)


def refresh(o: Options) -> None:
    _run("RefreshWorkflow", o)


def _steer(action: str, o: Options) -> str:
    if api_mode():
        from stackflow.cli.remote import steer

        return steer(o["project"], o["workspace"], action, o.get("reason"))
    from stackflow.cli.steer import steer_direct

    return steer_direct(action, o)


def approve(o: Options) -> None:
    echo_safe(_steer("approve", o))


def reject(o: Options) -> None:
    echo_safe(_steer("reject", o))


def retry(o: Options) -> None:
    echo_safe(_steer("retry", o))


def abort(o: Options) -> None:
    echo_safe(_steer("abort", o))


def cancel(o: Options) -> None:
    from stackflow.cli.output import echo

    echo(f"cancel requested for {_steer('cancel', o)}")


def status(o: Options) -> None:
    from stackflow.cli.views import print_status

    if api_mode():
        from stackflow.cli.remote import status as remote_status

        data, link = remote_status(o["project"], o["workspace"])
    else:
        from stackflow.cli.steer import status_direct

        data, link = status_direct(o)
    print_status(data, link, o["output"])


def events(o: Options) -> None:
    """`stackflow events`: a run's stream as a line per event, its own lines, or JSON."""
    from stackflow.cli import event_lines

    collect = event_lines.Collect()
    sink = {"ndjson": event_lines.ndjson_sink, "table": event_lines.table_sink}.get(
        o["output"], collect
    )
    args = (o["run"], o["after"], o["follow"])
    if api_mode():
        from stackflow.client.types import Stack

        event_lines.api_events(Stack(o["project"], o["workspace"]), *args, sink)
    else:
        import asyncio

        from stackflow.cli.events import direct_events
        from stackflow.core.refs import StackRef

        stack = StackRef(o["project"], o["workspace"])
        asyncio.run(direct_events(stack, *args, o["unavailable_timeout"], sink))
    if o["output"] == "json":
        collect.dump()
