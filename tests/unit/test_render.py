from __future__ import annotations

import io

from rich.console import Console

from stackflow.diff import Preview, diff_resource
from stackflow.render import render_preview, summary_line


def make_preview() -> Preview:
    return Preview(
        changes=[
            diff_resource("a", "OnPrem", {"x": 1}, None, None),
            diff_resource("b", "OnPrem", {"x": 2}, {"x": 1}, {"x": 3}),
            diff_resource("c", "OnPrem", {"x": 1}, {"x": 1}, None),
        ]
    )


def test_table_and_summary() -> None:
    buf = io.StringIO()
    render_preview(make_preview(), Console(file=buf, width=120), detail=False)
    text = buf.getvalue()
    assert "Create" in text and "Update" in text and "UnChanged" in text
    assert summary_line(make_preview()) in text
    assert "x: " not in text


def test_detail_lists_field_changes_plain_without_tty() -> None:
    buf = io.StringIO()
    render_preview(make_preview(), Console(file=buf, width=120), detail=True)
    text = buf.getvalue()
    assert "  x: <none> -> 1" in text
    assert "  x: 1 -> 2" in text
    assert "\x1b[" not in text  # no colour codes when not a terminal


def test_colour_on_a_terminal() -> None:
    buf = io.StringIO()
    render_preview(make_preview(), Console(file=buf, width=120, force_terminal=True), detail=True)
    assert "\x1b[" in buf.getvalue()


def test_ids_are_printed_as_they_are_never_as_emoji_or_markup() -> None:
    """`v1:Secret:ns:x` holds rich's `:secret:` emoji code; `[b]` would be markup."""
    from io import StringIO

    from rich.console import Console

    from stackflow.diff import Action, Change, Preview
    from stackflow.render import render_preview

    out = StringIO()
    preview = Preview(
        changes=[
            Change(id="v1:Secret:default:db", type="Kubernetes", action=Action.Create),
            Change(id="onprem:File:/tmp/[b]x", type="OnPrem", action=Action.Create),
        ]
    )
    render_preview(preview, Console(file=out, width=200), detail=False)
    text = out.getvalue()
    assert "v1:Secret:default:db" in text
    assert "/tmp/[b]x" in text


def test_plan_line_counts_every_resource_past_the_listing() -> None:
    """A run lists only its first changes; the plan line counts all of them."""
    from io import StringIO

    from rich.console import Console

    from stackflow.diff import Preview
    from stackflow.render import render_preview, summary_line

    view = {
        "changes": [{"id": "a", "type": "OnPrem", "action": "Create", "diff": []}],
        "summary": {"Create": 1, "Update": 0, "Delete": 0, "UnChanged": 1000},
        "truncated": True,
    }
    preview = Preview.model_validate(view)
    assert summary_line(preview) == "Plan: 1 to create, 0 to update, 0 to delete, 1000 unchanged"
    out = StringIO()
    render_preview(preview, Console(file=out, width=200), detail=False)
    assert "listing 1 of 1001 resources" in out.getvalue()
    assert Preview.model_validate({"changes": view["changes"]}).summary["Create"] == 1


def test_many_long_node_errors_stay_within_the_budget() -> None:
    from stackflow.budget import BUDGET, fit_errors, size_of
    from stackflow.operation import NodeResult, NodeStatus

    results = [
        NodeResult(id=f"r{i}", action="Create", status=NodeStatus.failed, error="x" * 2000)
        for i in range(500)
    ]
    fitted = fit_errors(results)
    assert size_of([r.model_dump() for r in fitted]) < BUDGET
    assert all(r.error and r.error.endswith("(2000 chars)") for r in fitted)
    few = results[:3]
    assert fit_errors(few) == few  # under the budget: untouched


def _rich_changes_table(rows: list[tuple[str, str, str]], width: int) -> str:
    from rich.table import Table
    from rich.text import Text

    from stackflow.cli.output import SafeConsole

    table = Table(show_header=True, header_style="bold")
    table.add_column("ID", overflow="fold")
    table.add_column("Type")
    table.add_column("Action")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out = io.StringIO()
    SafeConsole(file=out, emoji=False, width=width, soft_wrap=True).print(table)
    return out.getvalue()


def test_the_plain_changes_table_is_what_rich_prints() -> None:
    """Wherever ``plain_grid`` lays a preview's table out itself (off a terminal), it is
    rich's table to the character; elsewhere (too wide, not plain ASCII) it leaves it to
    rich, and the preview a console off a terminal prints is the same either way."""
    import random

    from stackflow.render import plain_grid

    rnd = random.Random(26)
    laid_out = 0
    for _ in range(2000):
        rows = [
            (
                f"v1:ConfigMap:ns-{rnd.randint(0, 9)}:{'c' * rnd.randint(0, 40)}",
                rnd.choice(["Kubernetes", "Terraform", "OnPrem", ""]),
                rnd.choice(["Create", "Update", "Delete", "UnChanged"])
                + rnd.choice(["", " (drift)"]),
            )
            for _ in range(rnd.randint(1, 12))
        ]
        width = rnd.randint(20, 160)
        plain = plain_grid(("ID", "Type", "Action"), rows, width)
        if plain is not None:
            laid_out += 1
            assert plain + "\n" == _rich_changes_table(rows, width), (rows, width)
    assert laid_out > 800  # the plain case is the common one
    assert plain_grid(("ID", "Type", "Action"), [("x" * 200, "OnPrem", "Create")], 80) is None
    assert plain_grid(("ID", "Type", "Action"), [("naïve", "OnPrem", "Create")], 80) is None
    # through render_preview: the same text off a terminal as rich's own table gives
    buf = io.StringIO()
    render_preview(make_preview(), Console(file=buf, width=120), detail=False)
    rows = [
        ("a", "OnPrem", "Create"),
        ("b", "OnPrem", "Update"),
        ("c", "OnPrem", "UnChanged"),
    ]
    assert buf.getvalue().startswith(_rich_changes_table(rows, 120))
