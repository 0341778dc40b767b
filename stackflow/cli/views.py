"""What a run command shows of a run: its preview's changes and its status,
written as plain text where :mod:`stackflow.cli.plain_render` lays them out as rich would,
else by rich (:mod:`stackflow.cli.render`, imported only then)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from stackflow.cli.plain_render import plain_changes, plain_table, preview_parts
from stackflow.cli.runs import console_width, stdout_is_terminal


def show_changes(changes: dict[str, Any], console: Any, detail: bool) -> None:
    """``stackflow.cli.render.render_run_preview(changes, console, detail=detail)``: on a
    :class:`PlainConsole`, the plain table written as it is; rich for the rest."""
    parts = preview_parts(changes)
    if getattr(console, "plain", False):
        # ``detail`` adds the fields of each change that has some: none, nothing added
        detailed = (
            detail
            and parts is not None
            and any(c["action"] != "UnChanged" and c["diff"] for c in parts[0])
        )
        if parts is not None and not detailed and not changes.get("policy"):
            text = plain_changes(*parts, console.width)
            if text is not None:
                console.out(text)
                return
        console = console.rich
    from stackflow.cli.render import render_changes, render_policy, render_run_preview

    if parts is None:
        render_run_preview(changes, console, detail=detail)
        return
    render_changes(*parts, console, detail)
    if changes.get("policy"):
        render_policy(changes["policy"], console)


def print_status(data: Mapping[str, Any], link: str, output: str) -> None:
    """What `stackflow status` prints for a run's status view (``StatusView``'s JSON):
    the view and its UI link as JSON, or a table (rich's, written as it is off a terminal)."""
    import json
    import os

    if output == "json":
        sys.stdout.write(json.dumps({**data, "ui": link}, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()
        return
    rows = [
        ("phase", str(data["phase"])),
        ("release", str(data["revision"]) if data["revision"] is not None else "-"),
        ("done", f"{data['done']}/{data['total']}, {data['failed']} failed"),
    ]
    if data["running"]:
        rows.append(("running", ", ".join(data["running"][:5])))
    if data["error"]:
        rows.append(("error", str(data["error"])))
    rows.append(("ui", link))
    plain = not stdout_is_terminal() and not os.environ.get("FORCE_COLOR")
    text = plain_table(rows, console_width(sys.stdout)) if plain else None
    if text is not None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # as rich's Console.on_broken_pipe: exit 1, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        return
    from rich.table import Table
    from rich.text import Text

    from stackflow.cli.console import stdout_console

    table = Table(show_header=False)
    for label, value in rows:  # Text: a resource id or an error is never read as markup
        table.add_row(label, Text(value))
    stdout_console().print(table)
