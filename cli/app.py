"""The typer application; command modules (offline, operations) register on ``app``."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from cli.output import error_line
from stackflow.errors import StackflowError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 operation failed (or infrastructure unreachable), 2 bad input, "
    "3 stack locked by a running operation, 4 run paused on failed nodes "
    "(stackflow retry / abort), or drift found (drift check)."
)


class StackflowGroup(TyperGroup):
    """Turns a StackflowError from any command into one red line on stderr and its exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except StackflowError as err:
            error_line(str(err))
            raise typer.Exit(err.exit_code) from err


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
