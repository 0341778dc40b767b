"""`stackflow state migrate`: the state backend's schema, and imports from older stackflow."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.app import EXIT_CODES_HELP, app
from cli.output import stdout_console
from stackflow.config import state_url
from stackflow.errors import ConflictError
from stackflow.state.backend import open_backend, redact_url
from stackflow.state.legacy import read_legacy_home

state_app = typer.Typer(
    help="The state backend (STACKFLOW_STATE_URL): schema migrations and imports.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(state_app, name="state")


@state_app.command("migrate")
def migrate(
    from_dir: Annotated[
        Path | None,
        typer.Option(
            "--from-dir",
            help="Also import the releases an earlier stackflow kept in this home "
            "(e.g. ~/.stackflow).",
        ),
    ] = None,
) -> None:
    """Bring the backend's schema up to date (idempotent); optionally import old releases."""
    url = state_url()
    backend = open_backend(url, migrate=True)
    console = stdout_console()
    console.print(f"{redact_url(url)}: schema at {backend.head_revision()}", highlight=False)
    if from_dir is not None:
        releases = read_legacy_home(from_dir.expanduser())
        stacks = sorted({(r.project, r.workspace) for r in releases})
        for project, workspace in stacks:
            if backend.revisions(project, workspace):
                raise ConflictError(
                    f"stack {project}/{workspace} already has releases in {redact_url(url)}; "
                    "migrate only into stacks with none"
                )
        for release in releases:
            backend.import_release(release)
        for project, workspace in stacks:
            count = sum(1 for r in releases if (r.project, r.workspace) == (project, workspace))
            console.print(f"imported {count} release(s) of {project}/{workspace}", highlight=False)
    backend.close()
