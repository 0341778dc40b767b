"""Console entry point: ``stackflow = "cli.main:main"``."""

from __future__ import annotations

import importlib
import sys

from cli.app import app
from cli.output import error_line
from stackflow.errors import StackflowError

COMMAND_MODULES = ("cli.offline", "cli.operations")


def load_commands() -> None:
    """Import the command modules so they register on ``app`` (operations is optional)."""
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise


def main() -> None:
    try:
        load_commands()
        app(prog_name="stackflow")
    except StackflowError as err:  # raised outside a command (e.g. while loading commands)
        error_line(str(err))
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
