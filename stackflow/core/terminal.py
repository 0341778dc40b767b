"""Text from specs, clients and infrastructure made safe to show on a terminal.

A spec author controls resource ids, attribute values and (through the API server, OpenTofu
or a file's content) error messages. Shown raw, a control sequence in any of them could clear
an approver's screen, move the cursor over a ``Delete`` line or recolour it; a bidi override
could show a different id than the one applied. Every human-readable output shows such
characters as visible escapes instead (``\\x1b``, ``\\u202e``); JSON output is left exact.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1 (incl. 8-bit CSI)
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidi marks, embeddings, overrides
    "\u2028\u2029]"  # line and paragraph separators
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control, bidi and line-separator character shown as an escape
    (tab and newline, which the console lays out itself, are kept)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def one_line_safe(text: str) -> str:
    """``terminal_safe`` for a one-line message: newlines and tabs are escaped too."""
    return terminal_safe(text).replace("\n", "\\n").replace("\t", "\\t")


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")


def markdown_text(text: str) -> str:
    """One line of spec-supplied text for Markdown (the Temporal UI's current details):
    controls escaped as on a terminal, and Markdown punctuation backslashed, so a message
    cannot add a link, an image or emphasis of its own."""
    return _MARKDOWN.sub(r"\\\1", one_line_safe(text))


def markdown_code(text: str) -> str:
    """``text`` as an inline code span that no backtick in it can close early."""
    text = one_line_safe(text)
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def human_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h10m``: how the CLI and the UI show an ETA."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
