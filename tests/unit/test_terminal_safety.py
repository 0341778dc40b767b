"""Hostile text never reaches an approver's terminal raw: ids, values and error messages
with escape sequences, carriage returns, C1 controls or bidi overrides are shown as escapes
in every human-readable output; JSON stays exact."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.table import Table
from rich.text import Text

from stackflow.cli.console import SafeConsole
from stackflow.cli.output import error_line
from stackflow.cli.render import render_preview
from stackflow.core.terminal import one_line_safe, terminal_safe
from stackflow.engine.diff import Preview, diff_resource

STACKFLOW = Path(sys.executable).parent / "stackflow"
CLEAR = "\x1b[2J"
HOSTILE = [CLEAR, "\r", "\x9b31m", "\u202e", "\x07", "\x00", "\u2028", "\x7f", "\x1b]8;;x\x07"]
RAW = ("\x1b[2J", "\r", "\x9b", "\u202e", "\x07", "\x00", "\u2028", "\x7f", "\x1b]")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain café ✓", "plain café ✓"),
        ("a\nb\tc", "a\nb\tc"),
        (f"x{CLEAR}y", "x\\x1b[2Jy"),
        ("over\rwrite", "over\\x0dwrite"),
        ("\x9b2J", "\\x9b2J"),
        ("gpj.\u202eexe", "gpj.\\u202eexe"),
        ("\u2066iso\u2069", "\\u2066iso\\u2069"),
        ("nul\x00", "nul\\x00"),
    ],
)
def test_terminal_safe_escapes_controls_and_bidi_only(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
    assert one_line_safe("a\nb\tc") == "a\\nb\\tc"


def _assert_no_raw(output: str) -> None:
    for raw in RAW:
        assert raw not in output, (raw, output)


def _hostile_preview() -> Preview:
    return Preview(
        changes=[
            diff_resource(
                f"onprem:File:/tmp/a{bad}b",
                "OnPrem",
                {"content": f"v{bad}w"},
                {"content": "old"},
                None,
            )
            for bad in HOSTILE
        ]
    )


@pytest.mark.parametrize("terminal", [True, False], ids=["tty", "pipe"])
def test_preview_table_and_details_show_escapes(terminal: bool) -> None:
    buf = io.StringIO()
    console = SafeConsole(file=buf, width=200, force_terminal=terminal, color_system="truecolor")
    render_preview(_hostile_preview(), console, detail=True)
    out = buf.getvalue()
    assert "onprem:File:/tmp/a\\x1b[2Jb" in out and "\\u202e" in out and "\\x9b31m" in out
    _assert_no_raw(out)
    if terminal:  # rich's own colours still pass
        assert "\x1b[" in out.replace("\x1b[2J", "")


def test_text_objects_and_tables_are_escaped_too() -> None:
    """Not only strings: a Text or a table cell built from a hostile value."""
    buf = io.StringIO()
    console = SafeConsole(file=buf, width=200, force_terminal=True)
    table = Table("id")
    table.add_row(Text(f"id{CLEAR}"))
    console.print(table)
    console.print(Text("msg\rfake Delete line\u202e"), markup=False)
    _assert_no_raw(buf.getvalue())
    assert "id\\x1b[2J" in buf.getvalue()


def test_error_lines_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    error_line(f"apply of x{CLEAR}: refused\r\u202e by the server")
    err = capsys.readouterr().err
    _assert_no_raw(err)
    assert err.strip() == "Error: apply of x\\x1b[2J: refused \\u202e by the server"


def test_the_real_cli_escapes_ids_in_tables_and_errors_but_json_stays_exact(
    tmp_path: Path,
) -> None:
    ids = [f"onprem:File:/tmp/f{i}{bad}" for i, bad in enumerate(HOSTILE)]
    resources = [
        {
            "id": rid,
            "type": "OnPrem",
            "attributes": {"kind": "File", "path": f"/tmp/f{i}", "content": "x"},
        }
        for i, rid in enumerate(ids)
    ]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"resources": resources}, allow_unicode=True))
    env = {**os.environ, "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STACKFLOW), *args], capture_output=True, text=True, env=env, timeout=60
        )

    table = run("graph", "-f", str(spec))
    assert table.returncode == 0, table.stderr
    _assert_no_raw(table.stdout)
    assert "onprem:File:/tmp/f0\\x1b[2J" in table.stdout
    exact = run("graph", "-f", str(spec), "--output", "json")
    assert sorted(rid for layer in json.loads(exact.stdout)["layers"] for rid in layer) == sorted(
        ids
    )

    resources[0]["dependsOn"] = [f"gone{CLEAR}\u202e"]
    spec.write_text(yaml.safe_dump({"resources": resources}, allow_unicode=True))
    bad = run("validate", "-f", str(spec))
    assert bad.returncode == 2
    _assert_no_raw(bad.stderr)
    assert "dependsOn: unknown resource 'gone\\x1b[2J\\u202e'" in bad.stderr


def test_current_details_markdown_cannot_be_steered_by_ids_or_errors() -> None:
    """The Temporal UI renders current details as Markdown: an id or an error message may
    not close its code span, add a link or an image, or carry control characters."""
    from stackflow.core.terminal import markdown_code, markdown_text

    assert markdown_code("v1:ConfigMap:ns:a") == "`v1:ConfigMap:ns:a`"
    assert markdown_code("a`b") == "``a`b``"
    assert markdown_code("`x``") == "``` `x`` ```"
    assert markdown_code(f"id{CLEAR}\nnext") == "`id\\x1b[2J\\nnext`"
    text = markdown_text("refused: see [docs](http://evil.example) ![x](y) **now**\r\u202e")
    assert text == (
        "refused: see \\[docs\\]\\(http://evil.example\\) \\!\\[x\\]\\(y\\) \\*\\*now\\*\\*"
        "\\\\x0d\\\\u202e"  # the escapes' own backslashes are backslashed: shown as \x0d
    )


def test_a_status_table_never_reads_a_resource_id_or_an_error_as_markup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A spec may name a resource ``[link=…]…``: `stackflow status` shows it as written, not
    as a hyperlink (an OSC 8 escape on a terminal) nor with its brackets eaten."""
    from stackflow.cli.views import print_status

    evil = "[link=https://evil.example]pay[/link]"
    data = {
        "phase": "applying",
        "revision": 1,
        "done": 0,
        "total": 1,
        "failed": 0,
        "running": [evil],
        "error": "[bold]boom[/bold]",
    }
    print_status(data, "http://ui", "table")
    out = capsys.readouterr().out
    assert evil in out and "[bold]boom[/bold]" in out
