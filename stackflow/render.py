"""Rich rendering of a preview: a table with a summary line, and per-resource field diffs.

The preview is drawn from plain data (:func:`render_changes`: the changes as their JSON
objects and the summary), so the CLI's quick path draws a preview from the API's answer
without the engine's models; :func:`render_preview` draws a :class:`~stackflow.diff.Preview`
the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from stackflow.diff import Preview

_STYLE = {  # by stackflow.diff.Action's values (an Action looks its style up as well)
    "Create": "green",
    "Update": "yellow",
    "Delete": "red",
    "UnChanged": "dim",
}


def _show(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def summary_line(preview: Preview) -> str:
    return _summary_text(preview.summary)


def _summary_text(s: Mapping[str, int]) -> str:
    return (
        f"Plan: {s['Create']} to create, {s['Update']} to update, "
        f"{s['Delete']} to delete, {s['UnChanged']} unchanged"
    )


def render_preview(preview: Preview, console: Console, detail: bool = False) -> None:
    """Print the change table, then (with ``detail``) each changed resource's field diff."""
    render_changes(
        [change.model_dump() for change in preview.changes],
        preview.summary,
        preview.truncated,
        preview.left_out,
        console,
        detail,
    )


_HEADERS = ("ID", "Type", "Action")


def plain_grid(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str | None:
    """rich's ``Table`` with a header (its default heavy-head box) as a console of ``width``
    that writes no styles prints it, for the plain case: printable ASCII cells that fit as
    they are; None otherwise (rich lays it out: folds, wraps, wide characters).
    tests/unit/test_render.py compares it with rich's output."""
    cells = [*headers, *(cell for row in rows for cell in row)]
    if not all(cell.isascii() and cell.isprintable() for cell in cells):
        return None
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    if sum(widths) + 3 * len(widths) + 1 > width:
        return None

    def rule(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def line(edge: str, row: Sequence[str]) -> str:
        return edge + edge.join(f" {c.ljust(w)} " for c, w in zip(row, widths, strict=True)) + edge

    lines = [rule("┏", "━", "┳", "┓"), line("┃", headers), rule("┡", "━", "╇", "┩")]
    lines += [line("│", row) for row in rows]
    lines.append(rule("└", "─", "┴", "┘"))
    return "\n".join(lines)


def render_changes(
    changes: Sequence[Mapping[str, Any]],
    summary: Mapping[str, int],
    truncated: bool,
    left_out: Mapping[str, Any] | None,
    console: Console,
    detail: bool = False,
) -> None:
    """:func:`render_preview` of a preview given as data: its changes as
    ``Change.model_dump()`` has them (``id``, ``type``, ``action``, ``drift``, ``diff`` of
    ``path``/``old``/``new``), the summary of every action's count, whether the list was
    cut and what ``--target``/``--exclude`` left out."""
    rows = [
        (str(c["id"]), str(c["type"]), str(c["action"]) + (" (drift)" if c["drift"] else ""))
        for c in changes
    ]
    styled = console.is_terminal or console.color_system is not None
    plain = None if styled else plain_grid(_HEADERS, rows, console.width)
    if plain is not None:  # off a terminal, where rich's layout costs 0.15 s per 200 rows
        console.out(plain, highlight=False)
    else:
        table = Table(show_header=True, header_style="bold")
        table.add_column("ID", overflow="fold")
        table.add_column("Type")
        table.add_column("Action")
        for change, (rid, rtype, label) in zip(changes, rows, strict=True):
            name = str(change["action"])
            action = Text(label, style=_STYLE[name])
            if change["drift"]:
                action.stylize("magenta", len(name))
            table.add_row(Text(rid), Text(rtype), action)
        console.print(table)
    console.print(_summary_text(summary), highlight=False)
    if truncated or len(changes) < sum(summary.values()):
        console.print(
            f"(listing {len(changes)} of {sum(summary.values())} resources: "
            "the first changes; unchanged ones are counted, not listed)",
            style="dim",
            highlight=False,
        )
    if left_out:
        left = left_out.get("resources") or []
        count = int(left_out.get("count") or len(left))
        console.print(
            f"Left out by --target/--exclude: {count} resource(s), state kept as recorded",
            style="cyan",
            highlight=False,
        )
        for item in left:
            via = f" ({item['via']})" if item.get("via") else ""
            console.print(Text(f"  - {item['id']}: {item['reason']}{via}"), highlight=False)
        if count > len(left):
            console.print(f"  … and {count - len(left)} more", style="dim", highlight=False)
    if not detail:
        return
    # one text, printed once (a print per line cost 0.3 s for 200 changes' 1,400 lines)
    lines = Text()
    for change in changes:
        name = str(change["action"])
        if name == "UnChanged" or not change["diff"]:
            continue
        lines.append("\n")
        lines.append(f"{name} ", style=f"bold {_STYLE[name]}")
        lines.append(change["id"], style="bold")
        if change["drift"]:
            lines.append(" (drift: live differs from the last applied state)", style="magenta")
        lines.append("\n")
        for field in change["diff"]:
            lines.append(f"  {field['path']}: ")
            lines.append(_show(field["old"]), style="red")
            lines.append(" -> ")
            lines.append(_show(field["new"]), style="green")
            lines.append("\n")
    if lines:
        console.print(lines, soft_wrap=True, end="")


_RULE_STYLE = {"deny": "red", "require_approval": "yellow", "warn": "yellow"}


def render_policy(decision: dict[str, Any], console: Console, digests: bool = False) -> None:
    """The policy gate's decision under a preview: the outcome, then each message (policy,
    resource, text; spec- and policy-supplied text is printed as plain text); with
    ``digests`` (``release show``) the input's and the bundles' digests too."""
    counts = decision.get("counts") or {}
    outcome = str(decision.get("outcome", "pass"))
    parts = [f"{n} {rule.replace('_', ' ')}" for rule, n in counts.items() if n]
    style = _RULE_STYLE.get(outcome, "green")
    line = Text("Policy: ", style="bold")
    line.append(outcome, style=style)
    if parts:
        line.append(f" ({', '.join(parts)})")
    policies = decision.get("policies") or []
    line.append(f" - {len(policies)} policies", style="dim")
    console.print(line)
    messages = decision.get("messages") or []
    if not messages and policies:
        console.print(Text(f"  evaluated: {', '.join(policies)}"), style="dim", highlight=False)
    for message in messages:
        rule = str(message.get("rule", ""))
        row = Text("  ")
        row.append(f"{rule:<16}", style=_RULE_STYLE.get(rule, ""))
        row.append(f" {message.get('policy', '')}", style="dim")
        if message.get("resource"):
            row.append(f" {message['resource']}")
        row.append(f": {message.get('msg', '')}")
        console.print(row, highlight=False)
    total = sum(counts.values())
    if total > len(messages):
        console.print(f"  … and {total - len(messages)} more", style="dim", highlight=False)
    if digests:
        bundles = ", ".join(f"{b['scope']} {b['digest']}" for b in decision.get("bundles") or [])
        console.print(
            Text(f"  input {decision.get('input_digest')}; bundles {bundles or 'none'}"),
            style="dim",
            highlight=False,
            soft_wrap=True,
        )


def render_run_preview(view: dict[str, Any], console: Console, detail: bool = False) -> None:
    """A run's preview view (``preview`` query, ``GET …/preview``): the changes, then the
    policy gate's decision when the run had policies."""
    from stackflow.diff import Preview

    render_preview(Preview.model_validate(view), console, detail=detail)
    if view.get("policy"):
        render_policy(view["policy"], console)


def render_outcome(
    console: Console,
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
    are each node result's id, status and error, drawn from plain data so the CLI's quick
    path prints them without the engine's models."""
    colour = "green" if phase == "succeeded" else "red"
    rev = f"release {revision} " if revision is not None else ""
    console.print(f"[bold]{operation}[/] {stack}: {rev}[{colour}]{phase}[/]")
    counts: dict[str, int] = {}
    for _, status, _ in results:
        counts[status] = counts.get(status, 0) + 1
    if counts:
        console.print("  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    failed = [(rid, error) for rid, status, error in results if status == "failed"]
    for rid, error in failed if len(failed) > 1 else []:
        console.print(f"  [red]✗ {escape(rid)}[/]: {escape(error or '')}")
    console.print(f"  Temporal UI: {link}")
