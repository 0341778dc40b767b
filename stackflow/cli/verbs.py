"""The commands of :data:`stackflow.cli.table.COMMANDS`, once for both ways in (the typer app,
or `stackflow` parsing the table itself): each takes its options by name and goes through
the API (:mod:`stackflow.cli.remote`): `stackflow serve` at ``STACKFLOW_API_URL``, or the API
in this process (:mod:`stackflow.api.local`)."""

from __future__ import annotations

from typing import Any

from stackflow.cli.output import echo_safe

Options = dict[str, Any]


def _run(workflow: str, o: Options) -> None:
    from stackflow.cli.remote import run

    run(workflow, o)


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
    from stackflow.cli.remote import steer

    return steer(o["project"], o["workspace"], action, o.get("reason"), o["unavailable_timeout"])


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
    from stackflow.cli.remote import status as remote_status
    from stackflow.cli.views import print_status

    data, link = remote_status(o["project"], o["workspace"], o["unavailable_timeout"])
    print_status(data, link, o["output"])


def events(o: Options) -> None:
    """`stackflow events`: a run's stream as a line per event, its own lines, or JSON."""
    from stackflow.cli import event_lines
    from stackflow.client.types import Stack

    collect = event_lines.Collect()
    sink = {"ndjson": event_lines.ndjson_sink, "table": event_lines.table_sink}.get(
        o["output"], collect
    )
    stack = Stack(o["project"], o["workspace"])
    event_lines.api_events(stack, o["run"], o["after"], o["follow"], sink, o["unavailable_timeout"])
    if o["output"] == "json":
        collect.dump()
