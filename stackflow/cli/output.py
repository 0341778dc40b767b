"""Output helpers shared by commands: ``--output`` choice, JSON vs table, error lines.
Standard library only: rich (:mod:`stackflow.cli.console`) is imported where it draws."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from stackflow.core.terminal import terminal_safe

if TYPE_CHECKING:
    from rich.console import Console


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def stdout_console() -> Console:
    from stackflow.cli.console import stdout_console

    return stdout_console()


def stderr_console() -> Console:
    from stackflow.cli.console import stderr_console

    return stderr_console()


def echo(text: str, err: bool = False) -> None:
    """``typer.echo`` of plain text: the line, flushed."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def echo_safe(text: str, err: bool = False) -> None:
    """``typer.echo`` for text that may carry spec- or client-supplied characters."""
    echo(terminal_safe(text), err=err)


def styled(stream: Any) -> bool:
    """Whether rich would write styles to ``stream`` (a terminal, or FORCE_COLOR)."""
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:
        return False


def error_line(message: str) -> None:
    """One red line on stderr (never wrapped, no markup interpretation); rich only where it
    writes the red (a terminal), else the line as rich writes it off one."""
    text = " ".join(message.split())
    if styled(sys.stderr):
        stderr_console().print(
            f"Error: {text}", style="red", markup=False, highlight=False, soft_wrap=True
        )
        return
    sys.stderr.write(terminal_safe(f"Error: {text}") + "\n")
    sys.stderr.flush()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False, default=str))
    sys.stdout.write("\n")


def emit(fmt: OutputFormat, data: Callable[[], Any], table: Callable[[Console], None]) -> None:
    """Print ``data()`` as JSON, or call ``table(console)`` for the human form."""
    if fmt is OutputFormat.json:
        print_json(data())
    else:
        table(stdout_console())
