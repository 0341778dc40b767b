"""What the CLI prints off a terminal, laid out without rich where rich prints text as it is.

A command whose output goes to a file or a pipe (a CI job's log) prints a run's change
table, its summary and its outcome. Off a terminal rich writes no styles and, with
``soft_wrap``, wraps nothing: printable text without markup comes out as it went in. A
run command (``stackflow.cli.runs.run_console``) prints that text itself through
:class:`PlainConsole` and imports rich (about 50 ms of CPU, half of its own) only for what
rich would lay out differently: markup, control characters, tabs, a table that does not fit,
a diff. :mod:`stackflow.cli.render` draws the rest, and tests/unit/test_render.py holds the two
to the same characters."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

HEADERS = ("ID", "Type", "Action")


def summary_text(s: Mapping[str, int]) -> str:
    return (
        f"Plan: {s['Create']} to create, {s['Update']} to update, "
        f"{s['Delete']} to delete, {s['UnChanged']} unchanged"
    )


def plain_grid(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, fold: int | None = None
) -> str | None:
    """rich's ``Table`` with a header (its default heavy-head box) as a console of ``width``
    that writes no styles prints it, for the plain case: printable ASCII cells that fit as
    they are, or (``fold``: the index of a column with ``overflow="fold"``) that fit once
    rich has narrowed that column alone and folded its cells, which then hold no space;
    None otherwise (rich lays it out: wraps, shares the narrowing, wide characters).
    tests/unit/test_render.py compares it with rich's output."""
    cells = [*headers, *(cell for row in rows for cell in row)]
    if not all(cell.isascii() and cell.isprintable() for cell in cells):
        return None
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    # what rich's Table._collapse_widths does when one column is the widest by enough: it
    # alone gives up the excess (each width counted with its cell's padding of 1 + 1)
    excess = sum(widths) + 3 * len(widths) + 1 - width
    if excess > 0:
        if fold is None:
            return None
        others = max((w for i, w in enumerate(widths) if i != fold), default=0)
        if widths[fold] - others < excess or widths[fold] - excess < 1:
            return None
        widths[fold] -= excess
        if any(" " in row[fold] for row in rows if len(row[fold]) > widths[fold]):
            return None  # rich wraps it at its spaces

    def rule(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def line(edge: str, row: Sequence[str]) -> str:
        return edge + edge.join(f" {c.ljust(w)} " for c, w in zip(row, widths, strict=True)) + edge

    def lines_of(row: Sequence[str]) -> list[str]:
        if fold is None or len(row[fold]) <= widths[fold]:
            return [line("│", row)]
        step = widths[fold]
        pieces = [row[fold][at : at + step] for at in range(0, len(row[fold]), step)]
        return [
            line(
                "│",
                [piece if i == fold else (cell if n == 0 else "") for i, cell in enumerate(row)],
            )
            for n, piece in enumerate(pieces)
        ]

    lines = [rule("┏", "━", "┳", "┓"), line("┃", headers), rule("┡", "━", "╇", "┩")]
    for row in rows:
        lines += lines_of(row)
    lines.append(rule("└", "─", "┴", "┘"))
    return "\n".join(lines)


def change_rows(changes: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """The change table's cells: id, type, and the action (with ``(drift)``)."""
    return [
        (str(c["id"]), str(c["type"]), str(c["action"]) + (" (drift)" if c["drift"] else ""))
        for c in changes
    ]


def listing_note(changes: Sequence[Mapping[str, Any]], truncated: bool, total: int) -> str | None:
    """The line under a change table that lists only some of the resources."""
    if not truncated and len(changes) >= total:
        return None
    return (
        f"(listing {len(changes)} of {total} resources: "
        "the first changes; unchanged ones are counted, not listed)"
    )


def plain_changes(
    changes: Sequence[Mapping[str, Any]],
    summary: Mapping[str, int],
    truncated: bool,
    left_out: Mapping[str, Any] | None,
    width: int,
) -> str | None:
    """``stackflow.cli.render.render_changes`` without ``detail``, as a console off a terminal
    prints it, when it is plain (see :func:`plain_grid`); None otherwise."""
    if left_out:
        return None
    grid = plain_grid(HEADERS, change_rows(changes), width, fold=0)
    if grid is None:
        return None
    lines = [grid, summary_text(summary)]
    note = listing_note(changes, truncated, sum(summary.values()))
    if note is not None:
        lines.append(note)
    return "\n".join(lines)


class PlainConsole:
    """The part of a rich console (off a terminal, ``soft_wrap``, no emoji) the run reports
    use: ``print`` and ``out`` of text rich would write as it is, written here; anything
    else goes to the rich console ``make_rich`` makes, on first need."""

    is_terminal = False
    color_system = None
    plain = True

    def __init__(self, width: int, make_rich: Callable[[], Any], file: TextIO | None = None):
        self.width = width
        self._make_rich = make_rich
        self._rich: Any = None
        self._file = file

    @property
    def rich(self) -> Any:
        if self._rich is None:
            self._rich = self._make_rich()
        return self._rich

    def _write(self, text: str) -> None:
        file = self._file or sys.stdout
        file.write(text)
        file.flush()

    def print(self, text: Any = "", *, markup: bool = True, **options: Any) -> None:
        """``Console.print``: a printable string (without ``[`` if it is markup) is written
        with its newline; styles (``style=``) show nowhere off a terminal."""
        if (
            isinstance(text, str)
            and text.isprintable()
            and not (markup and "[" in text)
            and set(options) <= {"style", "highlight"}
        ):
            self._write(text + "\n")
            return
        self.rich.print(text, markup=markup, **options)

    def out(self, text: str, *, highlight: bool = False) -> None:
        """``Console.out``: lines of printable text are written as they are."""
        if all(line.isprintable() for line in text.split("\n")):
            self._write(text + "\n")
            return
        self.rich.out(text, highlight=highlight)


def render_outcome(
    console: Any,
    operation: str,
    stack: str,
    revision: int | None,
    phase: str,
    results: Sequence[tuple[str, str, str | None]],
    link: str,
) -> None:
    """The lines a run command ends with (``stackflow.cli.report.report``'s table): the
    operation, the stack, its release and the phase; the node results counted by status;
    each failed node when more than one failed; the run's Temporal UI ``link``. ``results``
    are each node result's id, status and error, drawn from plain data so a command through
    the API prints them without the engine's models (and, on a :class:`PlainConsole`, without
    rich's markup)."""
    plain = getattr(console, "plain", False)
    rev = f"release {revision} " if revision is not None else ""
    if plain:
        console.print(f"{operation} {stack}: {rev}{phase}", markup=False)
    else:
        colour = "green" if phase == "succeeded" else "red"
        console.print(f"[bold]{operation}[/] {stack}: {rev}[{colour}]{phase}[/]")
    counts: dict[str, int] = {}
    for _, status, _ in results:
        counts[status] = counts.get(status, 0) + 1
    if counts:
        console.print("  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    failed = [(rid, error) for rid, status, error in results if status == "failed"]
    for rid, error in failed if len(failed) > 1 else []:
        if plain:
            console.print(f"  ✗ {rid}: {error or ''}", markup=False)
        else:
            from rich.markup import escape

            console.print(f"  [red]✗ {escape(rid)}[/]: {escape(error or '')}")
    console.print(f"  Temporal UI: {link}")


# ---- a run's preview, and the status table ---------------------------------------------------
ACTIONS = ("Create", "Update", "Delete", "UnChanged")
"""``stackflow.engine.diff.Action``'s values."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def preview_parts(
    view: Any,
) -> tuple[list[dict[str, Any]], dict[str, int], bool, dict[str, Any] | None] | None:
    """A run's preview view in the arguments of ``stackflow.cli.render.render_changes``
    (changes, summary, truncated, left_out) when it has the fields' types as
    ``stackflow.engine.diff.Preview`` reads them; None otherwise (the engine's model reads it)."""
    if not isinstance(view, dict) or "totals" in view:
        return None
    totals, changes = view.get("summary"), view.get("changes", [])
    truncated, left_out = view.get("truncated", False), view.get("left_out")
    if (
        not (totals is None or isinstance(totals, dict))
        or not isinstance(changes, list)
        or not isinstance(truncated, bool)
        or not (left_out is None or isinstance(left_out, dict))
        or not (totals is None or all(_is_int(v) for v in totals.values()))
    ):
        return None
    parts: list[dict[str, Any]] = []
    for change in changes:
        if not isinstance(change, dict):
            return None
        drift, diff = change.get("drift", False), change.get("diff", [])
        if (
            not isinstance(change.get("id"), str)
            or not isinstance(change.get("type"), str)
            or change.get("action") not in ACTIONS
            or not isinstance(drift, bool)
            or not isinstance(diff, list)
            or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in diff)
        ):
            return None
        fields = [{"path": f["path"], "old": f.get("old"), "new": f.get("new")} for f in diff]
        parts.append({**{k: change[k] for k in ("id", "type", "action")}, "drift": drift})
        parts[-1]["diff"] = fields
    counts = dict.fromkeys(ACTIONS, 0)
    if totals is not None:
        counts.update({k: v for k, v in totals.items() if k in counts})
    else:
        for part in parts:
            counts[part["action"]] += 1
    return parts, counts, truncated, left_out


def plain_table(rows: list[tuple[str, str]], width: int | None) -> str | None:
    """``rich.table.Table(show_header=False)`` of two columns with ``rows``, as a console of
    ``width`` prints it, for the plain case: printable ASCII without markup, where a value
    too long for its column is one word (rich cuts it with an ellipsis) and the first
    column keeps its width. None otherwise (rich lays it out: wraps, markup, wide
    characters, …). tests/unit/test_render.py compares it with rich's output."""
    if width is None or width < 20:
        return None
    cells = [cell for row in rows for cell in row]
    if not all(c and c.isascii() and c.isprintable() and "[" not in c for c in cells):
        return None
    first = max(len(label) for label, _ in rows) + 2  # with the cell padding
    second = max(len(value) for _, value in rows) + 2
    room = width - 3  # the three borders
    if first + second > room:
        if 2 * first > room:
            return None
        second = room - first
    inner = second - 2
    out = ["┌" + "─" * first + "┬" + "─" * second + "┐"]
    for label, value in rows:
        if len(value) > inner:
            if " " in value:
                return None  # rich wraps it over lines
            value = value[: inner - 1] + "…"
        out.append(f"│ {label.ljust(first - 2)} │ {value.ljust(inner)} │")
    out.append("└" + "─" * first + "┴" + "─" * second + "┘")
    return "\n".join(out) + "\n"
