from __future__ import annotations

import io

from rich.console import Console

from stackflow.cli.render import render_preview, summary_line
from stackflow.engine.diff import Preview, diff_resource


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

    from stackflow.cli.render import render_preview
    from stackflow.engine.diff import Action, Change, Preview

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

    from stackflow.cli.render import render_preview, summary_line
    from stackflow.engine.diff import Preview

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
    from stackflow.engine.budget import BUDGET, fit_errors, size_of
    from stackflow.temporal.operation import NodeResult, NodeStatus

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

    from stackflow.cli.console import SafeConsole

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
    rich's table to the character, its ids folded where rich folds them; elsewhere (not
    plain ASCII, ids wrapped at spaces, narrowing shared) it leaves it to rich, and the
    preview a console off a terminal prints is the same either way."""
    import random

    from stackflow.cli.plain_render import plain_grid

    rnd = random.Random(26)
    laid_out = folded = 0
    for _ in range(3000):
        rows = [
            (
                f"v1:ConfigMap:ns-{rnd.randint(0, 9)}:{'c' * rnd.randint(0, 40)}"
                + rnd.choice(["", "", "/" + "d" * rnd.randint(0, 60), " e" * rnd.randint(0, 9)]),
                rnd.choice(["Kubernetes", "Terraform", "OnPrem", ""]),
                rnd.choice(["Create", "Update", "Delete", "UnChanged"])
                + rnd.choice(["", " (drift)"]),
            )
            for _ in range(rnd.randint(1, 12))
        ]
        width = rnd.randint(20, 160)
        plain = plain_grid(("ID", "Type", "Action"), rows, width, fold=0)
        if plain is not None:
            laid_out += 1
            folded += len(plain.splitlines()) > len(rows) + 4
            assert plain + "\n" == _rich_changes_table(rows, width), (rows, width)
    assert laid_out > 1200 and folded > 300  # the plain case is the common one
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


def _console_pair(width: int) -> tuple[io.StringIO, io.StringIO, object, object]:
    """A PlainConsole and the rich console it stands for (``runs.console_for`` off a
    terminal), each writing to its own buffer."""
    from stackflow.cli.console import SafeConsole
    from stackflow.cli.plain_render import PlainConsole

    plain_out, rich_out = io.StringIO(), io.StringIO()

    def rich_of(buffer: io.StringIO) -> SafeConsole:
        return SafeConsole(file=buffer, width=width, soft_wrap=True, emoji=False)

    plain = PlainConsole(width, lambda: rich_of(plain_out), file=plain_out)
    return plain_out, rich_out, plain, rich_of(rich_out)


def test_the_plain_console_prints_what_rich_prints() -> None:
    """Off a terminal, whatever the PlainConsole writes itself is rich's output to the
    character; the rest it hands to rich (markup, controls, tabs, newlines, bidi)."""
    import random

    from rich.errors import MarkupError

    rnd = random.Random(1126)
    alphabet = "abc XYZ:/._-[]✗é漢\t\n\x1b\u202e\x07"
    given = ["[bold]apply[/] p/w", "a [b]c", "[red]✗ x[/]: y", "\\[dim] x", "x [/] y"]
    for n in range(1500 + len(given)):
        text = (
            given[n - 1500]
            if n >= 1500
            else "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))
        )
        markup = n >= 1500 or rnd.random() < 0.5
        style = rnd.choice([None, "dim", "cyan"])
        plain_out, rich_out, plain, rich = _console_pair(rnd.choice([40, 80, 120]))
        refused = []
        for console in (plain, rich):
            try:  # random markup may not parse: then both refuse it alike
                console.print(text, markup=markup, style=style, highlight=False)  # type: ignore[attr-defined]
            except MarkupError as exc:
                refused.append(str(exc))
            console.out(text)  # type: ignore[attr-defined]
        assert len(refused) in (0, 2) and len(set(refused)) <= 1, repr(text)
        assert plain_out.getvalue() == rich_out.getvalue(), repr(text)


def test_a_run_s_outcome_and_changes_are_the_same_on_either_console() -> None:
    from stackflow.cli.plain_render import render_outcome
    from stackflow.cli.views import show_changes

    results = [
        ("onprem:File:/tmp/a", "succeeded", None),
        ("onprem:File:/tmp/[b]", "failed", "cannot write: Permission denied"),
        ("v1:Secret:ns:x", "failed", "line one\nline\ttwo \x1b[31m"),
    ]
    changes = {
        "changes": [
            {"id": f"onprem:File:/tmp/f{i}", "type": "OnPrem", "action": "Create", "drift": False}
            for i in range(3)
        ],
        "summary": {"Create": 3, "Update": 0, "Delete": 0, "UnChanged": 5},
        "truncated": False,
    }
    for width in (40, 80, 200):
        plain_out, rich_out, plain, rich = _console_pair(width)
        for console in (plain, rich):
            show_changes(changes, console, False)
            render_outcome(console, "apply", "p/w", 4, "failed", results, "http://ui/x")
        assert plain_out.getvalue() == rich_out.getvalue()
        assert "Plan: 3 to create" in plain_out.getvalue()
        assert "\x1b" not in plain_out.getvalue()  # shown as an escape, never written
