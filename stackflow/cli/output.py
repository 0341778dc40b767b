"""Output helpers shared by commands: ``--output`` choice, JSON vs table, error lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.segment import Segment

from stackflow.core.terminal import terminal_safe


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


class SafeConsole(Console):
    """A rich Console that never writes a control character it was given as text.

    Rich's own styling and cursor movement come as control segments and pass; every text
    segment (ids, values, messages, whatever their source) has its control, bidi and
    line-separator characters shown as escapes (``stackflow.core.terminal``) on the way out."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(terminal_safe(segment.text), segment.style)
            for segment in buffer
        )


def stdout_console() -> Console:
    return SafeConsole(file=sys.stdout, emoji=False)


def stderr_console() -> Console:
    return SafeConsole(file=sys.stderr, emoji=False)


def echo_safe(text: str, err: bool = False) -> None:
    """``typer.echo`` for text that may carry spec- or client-supplied characters."""
    import typer

    typer.echo(terminal_safe(text), err=err)


def error_line(message: str) -> None:
    """One red line on stderr (never wrapped, no markup interpretation)."""
    text = " ".join(message.split())
    stderr_console().print(
        f"Error: {text}", style="red", markup=False, highlight=False, soft_wrap=True
    )


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False, default=str))
    sys.stdout.write("\n")


def emit(fmt: OutputFormat, data: Callable[[], Any], table: Callable[[Console], None]) -> None:
    """Print ``data()`` as JSON, or call ``table(console)`` for the human form."""
    if fmt is OutputFormat.json:
        print_json(data())
    else:
        table(stdout_console())
