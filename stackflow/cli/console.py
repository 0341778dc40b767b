"""The rich consoles the CLI draws on (imported only where rich lays something out: a
terminal, a table that is not plain text, a progress bar)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

from stackflow.core.terminal import terminal_safe


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
