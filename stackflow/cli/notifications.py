"""``stackflow notifications``: a project's outbound webhook deliveries that failed for good
(the dead-letter list), through the API."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stackflow.cli.api_mode import api_client
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.options import OutputOpt, ProjectOpt
from stackflow.cli.output import OutputFormat, emit
from stackflow.model.notifications import NotificationFailure

notifications_app = typer.Typer(
    help="Outbound notifications (CloudEvents to the project's webhook destinations).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(notifications_app, name="notifications")


@notifications_app.command("failed")
def failed(
    project: ProjectOpt,
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="At most this many."),
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Deliveries that did not succeed within their retries, newest first."""
    with api_client() as api:
        data = api.request("GET", f"/v1/projects/{project}/notifications/failed")
    failures = [NotificationFailure.model_validate(x) for x in data or []][:limit]

    def table(console: Console) -> None:
        t = Table("Failed at", "Destination", "Type", "Run", "Attempts", "Error")
        for f in failures:
            t.add_row(
                f.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
                Text(f.target),
                f.type.removeprefix("io.stackflow."),
                Text(f.run_id or ""),
                str(f.attempts),
                Text(" ".join(f.error.split())),
            )
        console.print(t)

    def data_() -> list[dict[str, Any]]:
        return [f.model_dump(mode="json") for f in failures]

    emit(output, data_, table)
