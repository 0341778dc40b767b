"""Console entry point: ``stackflow = "stackflow.cli.main:main"``."""

from __future__ import annotations

import importlib
import os
import sys

from stackflow.cli.app import app
from stackflow.cli.output import error_line
from stackflow.temporal_client import connection_error

COMMAND_MODULES = (
    "stackflow.cli.offline",
    "stackflow.cli.state",
    "stackflow.cli.operations",
    "stackflow.cli.steer",
    "stackflow.cli.drift",
    "stackflow.cli.serve",
    "stackflow.cli.events",
    "stackflow.cli.notifications",
    "stackflow.cli.sources",
    "stackflow.cli.notify",
    "stackflow.cli.policy",
)


def load_commands() -> None:
    """Import the command modules so they register on ``app`` (operations is optional)."""
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise


def main() -> None:
    os.umask(0o077)  # files the CLI writes (the embedded database, exports): 0600 / 0700
    code: int = 0
    try:
        load_commands()
        app(prog_name="stackflow")
    except Exception as exc:  # raised outside a command (e.g. while loading commands)
        err = connection_error(exc)
        if err is None:
            raise
        error_line(str(err))
        code = err.exit_code
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    # The Temporal SDK's Rust core threads can abort the interpreter while it finalizes
    # (SIGABRT after the command already succeeded), so flush and leave without finalizing.
    tracing = sys.modules.get("stackflow.tracing")  # loaded by a Temporal connection
    if tracing is not None:
        tracing.shutdown()  # STACKFLOW_TRACING=otlp: the command's spans, before os._exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
