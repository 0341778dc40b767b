"""The typer application; command modules (offline, operations) register on ``app``."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from stackflow.cli.output import error_line
from stackflow.temporal_client import connection_error

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 operation failed (or infrastructure or Temporal unreachable), "
    "2 bad input, "
    "3 stack locked by a running operation, 4 run paused on failed nodes "
    "(stackflow retry / abort), or drift found (drift check)."
)


class StackflowGroup(TyperGroup):
    """Turns a StackflowError from any command into one red line on stderr and its exit code,
    and so a Temporal connection or RPC error (``temporal_client.connection_error``): never a
    traceback for those."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            err = connection_error(exc)
            if err is None:
                raise
            error_line(str(err))
            raise typer.Exit(err.exit_code) from exc


app = typer.Typer(
    name="stackflow",
    cls=StackflowGroup,
    help="stackflow: Kusion-compatible infrastructure operations on Temporal.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

release_app = typer.Typer(
    help="Inspect, unlock and import releases of a stack.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(release_app, name="release")
