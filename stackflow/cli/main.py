"""Console entry point: ``stackflow = "stackflow.cli.main:main"``.

A few invocations are answered without the typer app (:mod:`stackflow.cli.quick`): the
top-level help, and in API mode `stackflow status`, `preview`, `apply --yes` and `destroy
--yes` in their plain case; everything else goes to the app, which
imports only the module of the command that runs (:class:`stackflow.cli.app.LazyGroup`)."""

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


def run_app() -> int:
    """The typer app on ``sys.argv``; its exit code."""
    try:
        from stackflow.cli.app import app

        app(prog_name="stackflow")
    except Exception as exc:  # raised outside a command (e.g. while loading commands)
        from stackflow.cli.app import one_line_error

        err = one_line_error(exc)
        if err is None:
            raise
        from stackflow.cli.output import error_line

        error_line(str(err))
        return err.exit_code
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def main() -> None:
    os.umask(0o077)  # files the CLI writes (the embedded database, exports): 0600 / 0700
    from stackflow.cli.quick import answer

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
