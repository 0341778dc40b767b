"""Console entry point: ``stackflow = "stackflow.cli.main:main"``.

`stackflow --help` is rendered from the static table of :mod:`stackflow.cli.commands`, and in
API mode (``STACKFLOW_API_URL``) the commands of :data:`stackflow.cli.table.COMMANDS` are
parsed with that table and run without the typer app (the same function the typer command
calls: :mod:`stackflow.cli.verbs`); everything else goes to the app, which imports only the
module of the command that runs (:class:`stackflow.cli.app.LazyGroup`)."""

from __future__ import annotations

import importlib
import os
import sys

from stackflow.cli.commands import MODULES

COMMAND_MODULES = MODULES


def load_commands() -> None:
    """Import every command module so all commands are registered on ``app`` (in-process
    callers such as tests; the console script imports them as commands are looked up). A
    command module that is not installed is skipped."""
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise


def one_line(exc: BaseException) -> int:
    """A command's error as the command group prints it: one red line, its exit code."""
    from stackflow.core.errors import StackflowError

    err: StackflowError | None = exc if isinstance(exc, StackflowError) else None
    if err is None:  # ``one_line_error`` takes a StackflowError as it is: typer not needed
        from stackflow.cli.app import one_line_error

        err = one_line_error(exc)
    if err is None:
        raise exc
    from stackflow.cli.output import error_line

    error_line(str(err))
    return err.exit_code


def run_app() -> int:
    """The typer app on ``sys.argv``; its exit code."""
    try:
        from stackflow.cli.app import app

        app(prog_name="stackflow")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Exception as exc:  # raised outside a command (e.g. while loading commands)
        return one_line(exc)
    return 0


def answer(argv: list[str]) -> int | None:
    """The exit code of ``argv`` answered without the typer app; None: run the app."""
    if not argv or argv == ["--help"]:
        from stackflow.cli.commands import render_help

        try:
            sys.stdout.write(render_help())
            sys.stdout.flush()
        except BrokenPipeError:
            return 1  # as typer ends on a closed pipe
        return 0 if argv else 2  # no arguments: the help, as a usage error (typer's exit 2)
    from stackflow.cli.api_mode import api_mode

    if not api_mode():
        return None
    from stackflow.cli import table

    cmd = table.BY_NAME.get(argv[0])
    options = None if cmd is None else table.parse(cmd, argv[1:])
    if cmd is None or options is None:
        return None
    module, _, name = cmd.run.partition(":")
    try:
        getattr(importlib.import_module(module), name)(options)
    except KeyboardInterrupt:
        return 130  # as typer exits on ^C
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Exception as exc:
        return one_line(exc)
    return 0


def main() -> None:
    os.umask(0o077)  # files the CLI writes (the embedded database, exports): 0600 / 0700
    code = answer(sys.argv[1:])
    if code is None:
        code = run_app()
    # The Temporal SDK's Rust core threads can abort the interpreter while it finalizes
    # (SIGABRT after the command already succeeded), so flush and leave without finalizing.
    tracing = sys.modules.get("stackflow.temporal.tracing")  # loaded by a Temporal connection
    if tracing is not None:
        tracing.shutdown()  # STACKFLOW_TRACING=otlp: the command's spans, before os._exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a closed pipe: what it did not take is lost either way
            continue
    os._exit(code)


if __name__ == "__main__":
    main()
