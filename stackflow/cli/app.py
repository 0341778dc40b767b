"""The typer application; command modules (offline, operations, …) register on ``app``.

The app's group is a :class:`LazyGroup`: it knows every command by name from the static
table in :mod:`stackflow.cli.commands` and imports a command's module only when that command
is looked up, so `stackflow preview` imports what preview needs and not the rest (the
Temporal SDK, the Kubernetes client, SQLAlchemy, …)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

from stackflow.cli.commands import APP_HELP, ENTRIES, EXIT_CODES_HELP, MODULES
from stackflow.core.errors import StackflowError

__all__ = ["EXIT_CODES_HELP", "LazyGroup", "StackflowGroup", "app", "one_line_error"]


def one_line_error(exc: BaseException) -> StackflowError | None:
    """``temporal_client.connection_error(exc)``, without importing the Temporal SDK when
    ``exc`` cannot be one of its errors (a command that never touched Temporal)."""
    if isinstance(exc, StackflowError):
        return exc
    if "temporalio.service" not in sys.modules and not isinstance(
        exc, RuntimeError | ConnectionError | TimeoutError
    ):
        return None
    if isinstance(exc, typer.Exit | typer.Abort):
        return None
    from stackflow.temporal.client import connection_error

    return connection_error(exc)


class StackflowGroup(TyperGroup):
    """Turns a StackflowError from any command into one red line on stderr and its exit code,
    and so a Temporal connection or RPC error (``temporal_client.connection_error``): never a
    traceback for those."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            err = one_line_error(exc)
            if err is None:
                raise
            from stackflow.cli.output import error_line

            error_line(str(err))
            raise typer.Exit(err.exit_code) from exc


class LazyGroup(StackflowGroup):
    """The top-level group: lists the commands of :data:`stackflow.cli.commands.COMMANDS`
    (in that order) and imports a command's module the first time the command is looked
    up; the module's ``@app.command()`` registrations then become click commands here. A
    command module that is not installed is a command that does not exist."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._synced = {m for m in MODULES if m in sys.modules}
        """Modules whose registrations this group's commands already hold."""

    def list_commands(self, ctx: Any) -> list[str]:
        registered = super().list_commands(ctx)
        return [*ENTRIES, *(name for name in registered if name not in ENTRIES)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = ENTRIES.get(cmd_name)
        if entry is not None and entry.module not in self._synced:
            try:
                importlib.import_module(entry.module)
            except ModuleNotFoundError as err:
                if err.name != entry.module:
                    raise
                return None
            # what the imported modules registered on ``app`` (and its sub-apps), as click
            # commands built the way typer builds them for ``app()``
            self.commands.update(typer.main.get_group(app).commands)
            self._synced = {m for m in MODULES if m in sys.modules}
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="stackflow",
    cls=LazyGroup,
    help=APP_HELP,
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
