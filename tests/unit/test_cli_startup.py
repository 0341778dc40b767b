"""How `stackflow` starts (issue 25): the top-level help comes from the static command table
without typer, rich or any engine module, the table lists exactly what the command modules
register, and `stackflow status`, `preview`, `apply --yes` and `destroy --yes` in API mode
answer on the standard library alone (see tests/integration/test_cli_api_mode.py for them
against a real API server) with exactly the output, messages and exit codes of the typer
command, falling back to it for anything else (a run already started: handed over to the
typer path's code, which goes on with it).

No timing here: what is asserted is what gets imported."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from stackflow.cli import quick, quick_args
from stackflow.cli.app import app
from stackflow.cli.commands import COMMANDS, EXIT_CODES_HELP, render_help
from stackflow.cli.main import load_commands
from stackflow.cli.quick_http import PROXY_ENV
from stackflow.model.release import Phase

REPO = Path(__file__).resolve().parents[2]
NEVER_FOR_HELP = ("temporalio", "typer", "rich", "pydantic", "kubernetes", "sqlalchemy", "httpx")


def imported(stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported (from its stderr)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name)
    return names


def run_main(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "stackflow.cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def test_the_static_table_is_what_the_command_modules_register() -> None:
    load_commands()
    group = typer.main.get_group(app)
    registered = {name: cmd for name, cmd in group.commands.items() if not cmd.hidden}
    assert [e.name for e in COMMANDS] == list(registered)  # names, in the order listed
    for entry in COMMANDS:
        command = registered[entry.name]
        assert entry.help == first_paragraph(command.help), entry.name
        callbacks = [command.callback] if command.callback else []
        callbacks += [c.callback for c in getattr(command, "commands", {}).values()]
        assert entry.module in {c.__module__ for c in callbacks if c is not None}, entry.name


def test_the_app_lists_and_loads_commands_from_the_table() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for entry in COMMANDS:
        assert f" {entry.name} " in result.stdout


@pytest.mark.parametrize("args", [("--help",), ()], ids=["help", "no-arguments"])
def test_top_level_help_imports_neither_typer_rich_nor_the_engine(args: tuple[str, ...]) -> None:
    done = run_main(*args, env={"PATH": "/usr/bin:/bin", "COLUMNS": "100"})
    assert done.returncode == (0 if args else 2)  # no arguments: a usage error, as typer's
    modules = imported(done.stderr)
    assert "stackflow.cli.quick" in modules
    for top in NEVER_FOR_HELP:
        assert not {m for m in modules if m == top or m.startswith(top + ".")}, top
    assert done.stdout == render_help(width=100, colour=False)
    text = " ".join(done.stdout.split())
    assert " ".join(EXIT_CODES_HELP.split()) in text
    for code in ("0 ok", "1 operation failed", "2 bad input", "3 stack locked", "4 run paused"):
        assert code in text
    for entry in COMMANDS:
        assert f"│ {entry.name} " in done.stdout


def test_help_is_wrapped_to_the_width() -> None:
    for width in (40, 80, 123):
        lines = render_help(width=width, colour=False).splitlines()
        assert max(len(line) for line in lines) == width
        assert all(len(line) in (0, width) for line in lines if line.startswith(("│", "╭", "╰")))


def test_the_quick_path_knows_the_engine_s_values() -> None:
    from stackflow.cli import remote
    from stackflow.engine.diff import Action
    from stackflow.engine.spec import MAX_SPEC_BYTES
    from stackflow.model.events import STREAM_NAME, STREAM_VERSION, EventType

    assert tuple(p.value for p in Phase) == quick.PHASES
    assert tuple(a.value for a in Action) == quick.ACTIONS
    assert tuple(t.value for t in EventType) == quick.EVENT_TYPES
    assert (STREAM_NAME, STREAM_VERSION) == quick.STREAM
    assert MAX_SPEC_BYTES == quick_args.MAX_SPEC_BYTES
    assert remote.CLOSE_WAIT == quick_args.CLOSE_WAIT


# ---- `stackflow status` in API mode: the quick answer against the typer command's -----------
RUN_ID = "0198a0c2-0000-7000-8000-000000000001"


class FakeApi(ThreadingHTTPServer):
    """Answers from ``pages``: ``"GET /path?query"`` (or ``"POST /path"``) -> (status,
    body); a body that is a list of objects is sent as a chunked NDJSON stream, one chunk
    a line."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.pages: dict[str, tuple[int, Any]] = {}
        self.seen: list[str] = []
        self.posted: list[Any] = []
        self.keys: list[str | None] = []
        self.drop: set[str] = set()
        """Requests (as ``pages`` names them) read once and left without an answer."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that closes a stream after its last line: nothing to print


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeApi

    def do_GET(self) -> None:
        self.answer("GET")

    def do_POST(self) -> None:
        self.server.posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.server.keys.append(self.headers.get("Idempotency-Key"))
        self.answer("POST")

    def answer(self, method: str) -> None:
        key = f"{method} {self.path}" if method == "POST" else self.path
        self.server.seen.append(key)
        if key in self.server.drop:
            self.server.drop.discard(key)
            self.close_connection = True
            return
        if self.headers.get("Authorization") != "Bearer t0ken":
            status, body = 401, {"type": "urn:stackflow:problem:unauthorized", "detail": "no"}
        else:
            status, body = self.server.pages.get(key, (404, {"detail": "no such path"}))
        self.send_response(status)
        if isinstance(body, list):
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in body:
                data = (json.dumps(line) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        data = json.dumps(body).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    server = FakeApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("STACKFLOW_API_URL", server.url)
    monkeypatch.setenv("STACKFLOW_API_TOKEN", "t0ken")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("STACKFLOW_TEMPORAL_UI", "http://ui.example:8233")
    for base in PROXY_ENV:
        monkeypatch.delenv(base, raising=False)
        monkeypatch.delenv(base.upper(), raising=False)
    yield server
    server.shutdown()
    server.server_close()


def summary(run_id: str, status: str, workflow_id: str = "stackflow/p/w") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "workflow_id": workflow_id,
        "operation": "apply",
        "status": status,
        "requested_by": "me",
        "message": None,
        "started_at": "2025-01-01T00:00:00Z",
        "ended_at": None,
    }


def view(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "run_id": RUN_ID,
        "workflow_id": "stackflow/p/w",
        "operation": "apply",
        "status": "running",
        "phase": "awaitingApproval",
        "revision": 4,
        "total": 3,
        "done": 0,
        "failed": 0,
        "running": [],
        "summary": {"Create": 3, "Update": 0, "Delete": 0, "UnChanged": 0},
        "eta_seconds": None,
        "error": None,
    }
    return {**base, **fields}


VIEWS = {
    "awaiting": view(),
    "applying": view(
        phase="applying",
        done=2,
        total=40,
        running=[f"onprem:File:/tmp/some/long/path/file-{i}.txt" for i in range(7)],
        eta_seconds=12,
    ),
    "failed": view(phase="failed", failed=1, error="node x failed: disk full", summary={}),
    "no-release": view(revision=None, eta_seconds=3.25, summary={}),
    "no-answer": view(phase=None, error=None),
    "no-answer-said-why": view(phase=None, error="the status query timed out"),
}


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_quick_status_prints_what_the_command_prints(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], name: str, output: str
) -> None:
    runs = "/v1/stacks/p/w/runs"
    fake_api.pages = {
        f"{runs}?page_size=20": (
            200,
            {"runs": [summary(RUN_ID, "running"), summary("older", "completed")]},
        ),
        f"{runs}/{RUN_ID}": (200, VIEWS[name]),
    }
    args = ["status", "-p", "p", "--workspace", "w", "--output", output]
    code = quick.answer(args)
    quick_out = capsys.readouterr()
    assert fake_api.seen == [f"{runs}?page_size=20", f"{runs}/{RUN_ID}"]
    load_commands()
    result = CliRunner().invoke(app, args)
    assert (code, quick_out.out, quick_out.err) == (
        result.exit_code,
        result.stdout,
        result.stderr,
    )
    assert code == (1 if name.startswith("no-answer") else 0)


@pytest.mark.parametrize(
    "runs",
    [
        [],
        [summary("a", "completed"), summary("b", "failed")],
        [summary("a", "running", "stackflow/p/w/preview")],
    ],
    ids=["never-ran", "ended", "only-a-preview"],
)
def test_quick_status_says_when_nothing_runs_as_the_command_does(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], runs: list[dict[str, Any]]
) -> None:
    fake_api.pages = {"/v1/stacks/p/w/runs?page_size=20": (200, {"runs": runs})}
    code = quick.answer(["status", "-p", "p", "-w", "w"])
    quick_out = capsys.readouterr()
    load_commands()
    result = CliRunner().invoke(app, ["status", "-p", "p", "-w", "w"])
    assert code == result.exit_code == 1
    assert quick_out.err == result.stderr and quick_out.err.startswith("Error: stack p/w has no")
    assert quick_out.out == result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "-pp"],
        ["status", "-p", "p", "--help"],
        ["status", "-p", "p", "-o", "JSON"],
        ["status", "-p", "p", "-o", "ndjson"],
        ["status", "-p", "p", "-p", "q"],
        ["status", "-p", "a/b"],
        ["status", "-p", "p", "--unavailable-timeout", "-1"],
        ["status", "-p", "p", "--unavailable-timeout", "1e3"],
        ["status", "-p", "p", "extra"],
        ["status", "--project="],
        ["approve", "-p", "p"],
        ["--help", "status"],
    ],
)
def test_anything_but_the_plain_case_goes_to_the_typer_app(
    fake_api: FakeApi, args: list[str]
) -> None:
    assert quick.answer(args) is None
    assert fake_api.seen == []


def test_an_answer_that_is_not_a_success_goes_to_the_typer_app(
    fake_api: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = "/v1/stacks/p/default/runs?page_size=20"
    monkeypatch.setenv("STACKFLOW_API_TOKEN", "wrong")
    assert quick.answer(["status", "-p", "p"]) is None  # 401: the command says it its way
    monkeypatch.setenv("STACKFLOW_API_TOKEN", "t0ken")
    fake_api.pages = {runs: (200, {"runs": [{"run_id": 1}]})}
    assert quick.answer(["status", "-p", "p"]) is None  # not a RunPage: the client says so
    fake_api.pages = {runs: (503, {"detail": "Temporal is unreachable"})}
    assert quick.answer(["status", "-p", "p"]) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    seen = len(fake_api.seen)
    assert quick.answer(["status", "-p", "p"]) is None  # httpx would use the proxy
    assert len(fake_api.seen) == seen
    assert capsys.readouterr().out == ""


def rich_table(rows: list[tuple[str, str]], width: int) -> str:
    from rich.table import Table

    from stackflow.cli.output import SafeConsole

    out = io.StringIO()
    table = Table(show_header=False)
    for row in rows:
        table.add_row(*row)
    SafeConsole(file=out, emoji=False, width=width).print(table)
    return out.getvalue()


def test_the_plain_status_table_is_what_rich_prints() -> None:
    """Wherever ``plain_table`` lays the status table out itself, it is rich's table to the
    character; elsewhere it leaves it to rich."""
    rnd = random.Random(25)
    laid_out = 0
    for _ in range(3000):
        rows = [
            ("phase", rnd.choice(quick.PHASES)),
            ("release", str(rnd.randint(1, 10 ** rnd.randint(1, 6)))),
            ("done", f"{rnd.randint(0, 99)}/{rnd.randint(0, 999)}, {rnd.randint(0, 9)} failed"),
        ]
        if rnd.random() < 0.4:
            ids = [f"onprem:File:/tmp/{'x' * rnd.randint(1, 30)}" for _ in range(rnd.randint(1, 5))]
            rows.append(("running", ", ".join(ids)))
        if rnd.random() < 0.3:
            words = ["word" * rnd.randint(1, 6) for _ in range(rnd.randint(1, 12))]
            rows.append(("error", " ".join(words) if rnd.random() < 0.7 else "".join(words)))
        rows.append(
            ("ui", "http://127.0.0.1:8233/namespaces/default/workflows/" + "w" * rnd.randint(1, 90))
        )
        width = rnd.randint(15, 200)
        plain = quick.plain_table(rows, width)
        if plain is not None:
            laid_out += 1
            assert plain == rich_table(rows, width), (rows, width)
    assert laid_out > 1500  # the plain case is the common one
    assert quick.plain_table([("phase", "a [b]")], 80) is None  # markup: rich's
    assert quick.plain_table([("phase", "wide ✓")], 80) is None


# ---- `stackflow preview` in API mode ----------------------------------------------------------
SPEC = """resources:
  - id: onprem:File:/tmp/quick/a.txt
    type: OnPrem
    attributes: {kind: File, path: /tmp/quick/a.txt, mode: "0644", content: "a\\n"}
"""
PREVIEW_ID = "0198a0c2-0000-7000-8000-00000000000f"
RUNS = "/v1/stacks/p/w/runs"


def change(rid: str, action: str, **fields: Any) -> dict[str, Any]:
    return {"id": rid, "type": "OnPrem", "action": action, "drift": False, "diff": [], **fields}


PREVIEWS = {
    "plain": {
        "changes": [
            change(
                "onprem:File:/tmp/quick/a.txt",
                "Create",
                diff=[
                    {"path": "content", "old": None, "new": "a\n"},
                    {"path": "mode", "old": None, "new": "0644"},
                ],
            )
        ],
        "summary": {"Create": 1, "Update": 0, "Delete": 0, "UnChanged": 0},
    },
    "drift-and-more": {
        "changes": [
            change(
                "x:1", "Update", drift=True, diff=[{"path": "a.b", "old": {"k": [1]}, "new": 2}]
            ),
            change("x:2", "Delete", diff=[{"path": "spec", "old": "s"}]),
            change("x:3", "UnChanged"),
        ],
        "summary": {"Create": 0, "Update": 1, "Delete": 1, "UnChanged": 40},
        "truncated": True,
        "left_out": {"count": 3, "resources": [{"id": "x:9", "reason": "excluded", "via": "x:8"}]},
        "diff_refs": ["abc"],
    },
    "no-summary": {"changes": [change("x:1", "Create"), change("x:2", "Create")]},
    "unchanged": {  # nothing to detail: drawn off a terminal without rich, detail or not
        "changes": [change(f"x:{i}", "UnChanged") for i in range(3)],
        "summary": {"Create": 0, "Update": 0, "Delete": 0, "UnChanged": 3},
    },
    "policy": {
        "changes": [change("x:1", "Create")],
        "summary": {"Create": 1, "Update": 0, "Delete": 0, "UnChanged": 0},
        "policy": {
            "outcome": "warn",
            "counts": {"deny": 0, "require_approval": 0, "warn": 1},
            "policies": ["naming"],
            "messages": [{"rule": "warn", "policy": "naming", "resource": "x:1", "msg": "hm"}],
        },
    },
    "odd-types": {  # not as the quick path reads it: rendered by the engine's model
        "changes": [change("x:1", "Create", drift=1)],
        "summary": {"Create": "1"},
    },
}


def started_preview(fake: FakeApi, preview: dict[str, Any], status: str = "completed") -> None:
    run = f"{RUNS}/{PREVIEW_ID}"
    created = {
        "run_id": PREVIEW_ID,
        "workflow_id": "stackflow/p/w/preview",
        "operation": "preview",
        "status_url": run,
        "events_url": run + "/events",
    }
    header = {
        "stream": "stackflow.events",
        "version": 1,
        "project": "p",
        "workspace": "w",
        "workflow_id": "stackflow/p/w/preview",
        "run_id": PREVIEW_ID,
    }
    t = "2025-01-01T00:00:00+00:00"
    events = [
        header,
        {"seq": 1, "type": "run_start", "time": t, "operation": "preview", "total": 1},
        {"seq": 2, "type": "phase", "time": t, "phase": "previewing"},
        {"seq": 3, "type": "run_complete", "time": t, "status": status, "counts": {}},
    ]
    final = view(
        run_id=PREVIEW_ID,
        workflow_id="stackflow/p/w/preview",
        operation="preview",
        status=status,
        phase="succeeded" if status == "completed" else "failed",
        error=None if status == "completed" else "the spec broke something",
        error_type=None if status == "completed" else "InternalError",
    )
    fake.pages = {
        f"POST {RUNS}": (201, created),
        f"{run}/events?after=0": (200, events),
        run: (200, final),
        f"{run}/preview": (200, preview),
    }


def compare_preview(
    fake: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path, *options: str
) -> tuple[int | None, str, str]:
    """The quick preview's (exit code, stdout, stderr), asserted equal to the typer
    command's against the same API; the quick one sends the file's text as ``spec_yaml``."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    args = ["preview", "-f", str(spec), "-p", "p", "-w", "w", *options]
    code = quick.answer(args)
    got = capsys.readouterr()
    assert fake.posted[-1] == {"operation": "preview", "spec_yaml": SPEC}
    load_commands()
    result = CliRunner().invoke(app, args)
    assert fake.posted[-1]["operation"] == "preview" and "spec" in fake.posted[-1]
    assert (code, got.out, got.err) == (result.exit_code, result.stdout, result.stderr)
    return code, got.out, got.err


@pytest.mark.parametrize("options", [(), ("--no-detail",), ("-o", "json")], ids=str)
@pytest.mark.parametrize("name", list(PREVIEWS))
def test_quick_preview_prints_what_the_command_prints(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    options: tuple[str, ...],
) -> None:
    started_preview(fake_api, PREVIEWS[name])
    code, out, _ = compare_preview(fake_api, capsys, tmp_path, *options)
    assert code == 0 and out
    assert (quick.preview_parts(PREVIEWS[name]) is None) == (name == "odd-types")


def test_a_preview_that_failed_ends_as_the_command_ends_it(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started_preview(fake_api, PREVIEWS["plain"], status="failed")
    code, out, err = compare_preview(fake_api, capsys, tmp_path)
    assert code == 1 and out == "" and "the spec broke something" in err


def test_a_refused_preview_start_goes_to_the_typer_app(fake_api: FakeApi, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    problem = {"type": "urn:stackflow:problem:invalid-input", "detail": "spec_yaml: bad"}
    fake_api.pages = {f"POST {RUNS}": (422, problem)}
    assert quick.answer(["preview", "-f", str(spec), "-p", "p", "-w", "w"]) is None
    for args in (
        ["-f", "-", "-p", "p"],  # stdin: read once, by the typer command
        ["-f", str(tmp_path / "missing.yaml"), "-p", "p"],
        ["-f", str(spec), "-p", "p", "--target", "x*"],
        ["-f", str(spec), "-p", "p", "-o", "ndjson"],
        ["-f", str(spec), "-p", "p", "--detail", "--no-detail"],
        ["-p", "p"],
    ):
        seen = len(fake_api.seen)
        assert quick.answer(["preview", *args]) is None, args
        assert len(fake_api.seen) == seen


# ---- `stackflow apply --yes` and `stackflow destroy --yes` in API mode ------------------------
RUN = f"{RUNS}/{RUN_ID}"
T = "2025-01-01T00:00:00.123456+00:00"
NEVER_ON_THE_QUICK_PATH = ("typer", "pydantic", "httpx", "temporalio", "sqlalchemy")


def event(seq: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "type": kind, "time": T, **data}


def node(rid: str, action: str = "Create") -> dict[str, Any]:
    return {"resource": {"id": rid, "type": "OnPrem"}, "action": action}


def walk(moving: str, action: str, ends: list[dict[str, Any]], **complete: Any) -> list[Any]:
    """A run's events: previewed, then ``moving`` with two nodes whose ends are ``ends``
    (each an apply_complete or apply_errored event's type and fields), then its end."""
    events = [
        event(1, "run_start", operation="apply", total=2, revision=4),
        event(2, "phase", phase="previewing", revision=4),
        event(3, "planned_change", **node("x:1", action), drift=False),
        event(4, "change_summary", add=2, change=0, remove=0, unchanged=0),
        event(5, "phase", phase=moving, revision=4),
        event(6, "apply_start", **node("x:1", action)),
        event(7, "apply_start", **node("x:2", action)),
    ]
    for seq, end in enumerate(ends, 8):
        events.append(event(seq, end.pop("type"), **end))
    seq = len(events) + 1
    events.append(event(seq, "phase", phase=complete.get("status", "succeeded")))
    events.append(event(seq + 1, "run_complete", revision=4, **complete))
    return events


def done(rid: str, action: str = "Create") -> dict[str, Any]:
    return {"type": "apply_complete", **node(rid, action), "elapsed_seconds": 0.01}


def errored(rid: str, error: str, error_type: str = "Unreachable") -> dict[str, Any]:
    return {"type": "apply_errored", **node(rid), "error": error, "error_type": error_type}


PLAN = PREVIEWS["plain"]
RUNS_OF = {  # name -> (events, final view's fields, preview)
    "succeeded": (
        walk("applying", "Create", [done("x:2"), done("x:1")], counts={"succeeded": 2}),
        {},
        PLAN,
    ),
    "no-counts": (walk("applying", "Create", [done("x:1"), done("x:2")]), {}, PLAN),
    "nodes-failed": (
        walk(
            "applying",
            "Create",
            [errored("x:1", "disk [full]"), errored("x:2", "no route")],
            status="failed",
            counts={"failed": 2},
        ),
        {"phase": "failed", "error": "2 node(s) failed", "error_type": "Unreachable"},
        PLAN,
    ),
    "one-bad-input": (
        walk(
            "applying",
            "Create",
            [done("x:2"), errored("x:1", "outside the roots", "InvalidInput")],
            status="failed",
            counts={"failed": 1, "succeeded": 1},
        ),
        {"phase": "failed", "error": "x:1: outside the roots", "error_type": "InvalidInput"},
        PLAN,
    ),
    "failed-in-preview": (
        [
            event(1, "run_start", operation="apply", total=1),
            event(2, "phase", phase="previewing"),
            event(3, "phase", phase="failed"),
            event(4, "run_complete", status="failed", counts={}),
        ],
        {"phase": "failed", "error": "preview failed: x", "error_type": "SpecError"},
        {"changes": [], "summary": {"Create": 0, "Update": 0, "Delete": 0, "UnChanged": 0}},
    ),
    "no-release": (
        walk("applying", "Create", [done("x:1"), done("x:2")], counts={"succeeded": 2}),
        {"revision": None},
        PLAN,
    ),
    "workflow-failed": (
        walk("applying", "Create", [done("x:1"), done("x:2")]),
        {"status": "failed", "phase": None, "error": "boom", "error_type": None},
        PLAN,
    ),
    "stack-locked": (
        [event(1, "run_complete", status="failed")],
        {"status": "failed", "phase": None, "error": "busy", "error_type": "StackLocked"},
        PLAN,
    ),
    "destroyed": (
        walk("destroying", "Delete", [done("x:1", "Delete"), done("x:2", "Delete")]),
        {"operation": "destroy"},
        PREVIEWS["drift-and-more"],
    ),
}


def started_run(fake: FakeApi, events: list[Any], final: dict[str, Any], preview: Any) -> None:
    """The API of a run started by apply or destroy: its stream from any ``after``, its
    final view, preview and release (none for release 4 when the view has no revision)."""
    operation = final.get("operation", "apply")
    created = {
        "run_id": RUN_ID,
        "workflow_id": "stackflow/p/w",
        "operation": operation,
        "status_url": RUN,
        "events_url": RUN + "/events",
    }
    header = {
        "stream": "stackflow.events",
        "version": 1,
        "project": "p",
        "workspace": "w",
        "workflow_id": "stackflow/p/w",
        "run_id": RUN_ID,
    }
    ended = view(
        status="completed", phase="succeeded", operation=operation, error_type=None, summary={}
    )
    ended.update(final)
    fake.pages = {
        f"POST {RUNS}": (201, created),
        RUN: (200, ended),
        f"{RUN}/preview": (200, preview),
        f"POST {RUN}/approve": (
            200,
            {"run_id": RUN_ID, "workflow_id": "stackflow/p/w", "action": "approve", "result": "ok"},
        ),
    }
    if final.get("revision", 4) is not None and operation == "apply":
        fake.pages["/v1/stacks/p/w/releases/4"] = (200, {"revision": 4, "phase": "succeeded"})
    for after in range(len(events) + 1):
        later = [e for e in events if e["seq"] > after]
        fake.pages[f"{RUN}/events?after={after}"] = (200, [header, *later])


def run_args(tmp_path: Path, command: str, *options: str) -> list[str]:
    if command == "destroy":
        return ["destroy", "-p", "p", "-w", "w", *options]
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    return ["apply", "-f", str(spec), "-p", "p", "-w", "w", *options]


def compare_run(
    fake: FakeApi, capsys: pytest.CaptureFixture[str], args: list[str], same_asks: bool = True
) -> tuple[int | None, str, str, list[str]]:
    """The quick answer's (exit code, stdout, stderr, requests), asserted equal to the typer
    command's against the same API (with ``same_asks``, its requests too, but for the
    event streams: a hand-over reads the rest of a stream after what was taken); the
    request it starts the run with is the typer command's, with the spec as the file's
    text."""
    fake.seen.clear()
    code = quick.answer(args)
    got = capsys.readouterr()
    quick_seen = list(fake.seen)
    load_commands()
    fake.seen.clear()
    result = CliRunner().invoke(app, args)
    starts = [body for body in fake.posted if "operation" in body]
    assert len(starts) == 2  # one start each (the others: approvals)
    quick_body, typer_body = starts
    assert (code, got.out, got.err) == (result.exit_code, result.stdout, result.stderr)
    streams = [s for s in quick_seen if "/events?" in s]
    if same_asks:
        asked = [s for s in quick_seen if s not in streams]
        assert asked == [s for s in fake.seen if "/events?" not in s]
    assert streams[0].endswith("/events?after=0")
    if "spec_yaml" in quick_body:
        from stackflow.engine.spec import parse_spec_text

        spec = parse_spec_text(quick_body.pop("spec_yaml"))
        assert typer_body.pop("spec") == spec.model_dump(mode="json", by_alias=True)
    assert quick_body == typer_body
    assert quick_body == {
        "operation": args[0],
        "auto_approve": True,
        "on_failure": "fail",
        "max_concurrency": 8,
    }
    return code, got.out, got.err, quick_seen


@pytest.mark.parametrize(
    "options",
    [
        ("--yes",),
        ("-y", "-o", "json"),
        ("--yes", "--detail"),
        ("--no-detail", "--output=json", "-y"),
    ],
    ids=str,
)
@pytest.mark.parametrize("name", list(RUNS_OF))
def test_quick_apply_and_destroy_print_what_the_commands_print(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    options: tuple[str, ...],
) -> None:
    events, final, preview = RUNS_OF[name]
    started_run(fake_api, events, final, preview)
    command = "destroy" if final.get("operation") == "destroy" else "apply"
    if command == "destroy" and "detail" in str(options):
        options = tuple(o for o in options if "detail" not in o)
    code, out, err, seen = compare_run(fake_api, capsys, run_args(tmp_path, command, *options))
    assert [s for s in seen if "/events?" in s] == [f"{RUN}/events?after=0"]  # no hand-over
    wanted = {
        "nodes-failed": 1,
        "one-bad-input": 2,
        "failed-in-preview": 2,
        "workflow-failed": 1,
        "stack-locked": 3,
    }
    assert code == wanted.get(name, 0)
    assert (err == "") == (code == 0)
    if final.get("status") == "failed":  # failed as a workflow: no report, its one line
        assert "Temporal UI:" not in out and '"phase"' not in out
        assert err.startswith("Error: ") and len(err.splitlines()) == 1
    elif "json" in str(options):
        data = json.loads(out)
        assert data["ui"].endswith(f"/workflows/stackflow%2Fp%2Fw/{RUN_ID}")
        assert data["release"] == (
            None
            if name == "no-release"
            else fake_api.pages.get("/v1/stacks/p/w/releases/4", (0, None))[1]
        )
    else:
        assert "Temporal UI:" in out and ("Plan:" in out) == (name != "failed-in-preview")


@pytest.mark.parametrize(
    "events",
    [
        [
            event(1, "run_start", total=2),
            event(2, "policy_decision", outcome="warn", input_digest="d", counts={"warn": 1}),
            event(3, "phase", phase="applying"),
            event(4, "apply_start", **node("x:1")),
            event(5, "apply_complete", **node("x:1")),
            event(6, "run_complete", status="succeeded", counts={"succeeded": 1}),
        ],
        [
            event(1, "run_start", total=2),
            event(
                2,
                "policy_decision",
                outcome="require_approval",
                input_digest="d",
                counts={"require_approval": 1},
                messages=[{"policy": "run/p.rego", "rule": "require_approval", "msg": "ask"}],
            ),
            event(3, "approval_wait", wait="approval", timeout_seconds=60),
            event(4, "phase", phase="applying"),
            event(5, "apply_complete", **node("x:1")),
            event(6, "run_complete", status="succeeded"),
        ],
        [
            event(1, "run_start", total=2),
            event(2, "phase", phase="applying"),
            event(3, "apply_start", **node("x:1")),
            event(4, "approval_wait", wait="approval", timeout_seconds=60),
            event(5, "apply_complete", **node("x:1")),
            event(6, "run_complete", status="succeeded"),
        ],
        [
            event(1, "run_start", total=2),
            event(2, "phase", phase="applying"),
            event(3, "apply_errored", **node("x:1"), error="e", error_type="Unreachable"),
            event(4, "approval_wait", wait="decision", timeout_seconds=60),
        ],
        [
            event(1, "run_start", total=2),
            event(2, "phase", phase="applying"),
            event(3, "apply_start", **node("x:1")),
            {**event(4, "apply_complete", **node("x:1")), "time": "2025-01-01 00:00:00Z"},
            event(5, "apply_errored", **node("x:2"), error="e", error_type="Conflict"),
            event(6, "run_complete", status="failed"),
        ],
        [
            event(1, "phase", phase="previewing"),
            event(2, "run_start", total="2"),
            event(3, "phase", phase="applying"),
            event(4, "run_complete", status="succeeded"),
        ],
    ],
    ids=["policy", "approver-needed", "approval", "paused", "odd-time", "odd-total"],
)
@pytest.mark.parametrize("output", ["table", "json"])
def test_what_the_quick_path_does_not_take_goes_on_in_the_typer_path(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    events: list[dict[str, Any]],
    output: str,
) -> None:
    """The same run, handed over at the event the quick path does not take: what is
    printed is what the typer command prints, nothing twice, nothing left out."""
    started_run(fake_api, events, {}, PLAN)
    args = run_args(tmp_path, "apply", "--yes", "-o", output)
    code, _, err, seen = compare_run(fake_api, capsys, args)
    streams = [s for s in seen if "/events?" in s]
    assert len(streams) == 2 and streams[1] != streams[0]  # handed over, after what it took
    kinds = [e["type"] for e in events]
    if any(e.get("wait") == "decision" for e in events):
        assert code == 4 and "paused: 0 node(s) failed" in err  # the view's count
    elif "require_approval" in str(events):
        assert "policy requires an approver: run/p.rego: ask" in err
    elif "approval_wait" in kinds:
        assert f"POST {RUN}/approve" in seen  # the typer path approved (--yes)


def test_an_odd_final_view_goes_on_in_the_typer_path_without_following_again(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    events = walk("applying", "Create", [done("x:1"), done("x:2")], counts={"succeeded": 2})
    started_run(fake_api, events, {"total": 2.0}, PLAN)  # RunView takes 2.0; quick does not
    args = run_args(tmp_path, "apply", "-y")
    _, out, _, seen = compare_run(fake_api, capsys, args, same_asks=False)
    assert [s for s in seen if "/events?" in s] == [f"{RUN}/events?after=0"]
    assert seen.count(RUN) == 2  # its own, then the typer path's
    assert out.count("Plan:") == 1 and seen.count(f"{RUN}/preview") == 2  # shown once


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "-f", "{spec}", "-p", "p"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "-o", "ndjson"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--max-concurrency", "4"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--on-failure", "pause"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--policy", "{spec}"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--target", "x*"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--watch"],
        ["apply", "-f", "-", "-p", "p", "--yes"],
        ["apply", "-f", "{missing}", "-p", "p", "--yes"],
        ["apply", "-p", "p", "--yes"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--yes"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--detail", "--no-detail"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes=true"],
        ["apply", "-f", "{spec}", "-p", "p", "-yo", "json"],
        ["apply", "-f", "{spec}", "-p", "p", "--yes", "--help"],
        ["destroy", "-p", "p"],
        ["destroy", "-p", "p", "--yes", "--detail"],
        ["destroy", "-p", "p", "--yes", "-f", "{spec}"],
        ["destroy", "-p", "p", "--yes", "--fail-fast"],
        ["destroy", "-p", "p/q", "--yes"],
        ["destroy", "-p", "p", "--yes", "extra"],
        ["rollback", "-p", "p", "--to", "1", "--yes"],
    ],
    ids=" ".join,
)
def test_apply_and_destroy_but_the_plain_case_go_to_the_typer_app(
    fake_api: FakeApi, tmp_path: Path, args: list[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    given = [a.format(spec=spec, missing=tmp_path / "missing.yaml") for a in args]
    assert quick.answer(given) is None
    assert fake_api.seen == []


@pytest.mark.parametrize(
    "env", [{"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1"}, {"HTTPS_PROXY": "http://proxy:3128"}]
)
def test_a_table_on_a_terminal_or_a_proxy_goes_to_the_typer_app(
    fake_api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert quick.answer(run_args(tmp_path, "destroy", "--yes")) is None
    assert quick.answer(run_args(tmp_path, "apply", "--yes")) is None
    assert fake_api.seen == []


def test_a_start_whose_answer_was_lost_is_sent_again_with_its_key(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The connection drops after the start was sent: the typer path's client sends it
    again, with the same key and body (the API gives the run it started, if it did), and
    follows that run as the typer command does."""
    events, final, preview = RUNS_OF["succeeded"]
    started_run(fake_api, events, final, preview)
    fake_api.drop = {f"POST {RUNS}"}
    args = run_args(tmp_path, "apply", "--yes", "-o", "json")
    code = quick.answer(args)
    got = capsys.readouterr()
    assert fake_api.seen[:2] == [f"POST {RUNS}", f"POST {RUNS}"]
    assert fake_api.keys[0] == fake_api.keys[1] and (fake_api.keys[0] or "").startswith(
        "stackflow-cli-"
    )
    assert fake_api.posted[0] == fake_api.posted[1]
    load_commands()
    result = CliRunner().invoke(app, args)
    assert (code, got.out, got.err) == (result.exit_code, result.stdout, result.stderr)
    assert code == 0 and json.loads(got.out)["phase"] == "succeeded"


def test_a_refused_start_goes_to_the_typer_app(fake_api: FakeApi, tmp_path: Path) -> None:
    """A start refused for its input (the same answer whenever it is sent): the typer command
    checks the spec and options and says what is wrong."""
    problem = {"type": "urn:stackflow:problem:invalid-input", "detail": "spec_yaml: bad"}
    fake_api.pages = {f"POST {RUNS}": (422, problem)}
    assert quick.answer(run_args(tmp_path, "apply", "--yes", "-o", "json")) is None
    assert fake_api.seen == [f"POST {RUNS}"]


@pytest.mark.parametrize("force_color", [None, "", "1"])
@pytest.mark.parametrize("tty_compatible", [None, "0", "1", "x"])
@pytest.mark.parametrize("isatty", [True, False])
def test_the_quick_path_sees_a_terminal_where_rich_does(
    monkeypatch: pytest.MonkeyPatch,
    force_color: str | None,
    tty_compatible: str | None,
    isatty: bool,
) -> None:
    from stackflow.cli import quick_run
    from stackflow.cli.output import OutputFormat
    from stackflow.cli.runs import console_for

    for name, value in (("FORCE_COLOR", force_color), ("TTY_COMPATIBLE", tty_compatible)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    stdout = io.StringIO()
    monkeypatch.setattr(stdout, "isatty", lambda: isatty)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert quick_run.stdout_is_terminal() == console_for(OutputFormat.table).is_terminal


def test_the_quick_run_knows_the_engine_s_values() -> None:
    from stackflow.api.models import RunOperation
    from stackflow.cli import quick_run, remote, report
    from stackflow.model.release import Operation

    assert tuple(o.value for o in Operation) == quick_run.OPERATIONS
    assert {o.value for o in RunOperation} == set(quick_run.OPERATIONS)
    assert report.BAD_INPUT_TYPES == quick_run.BAD_INPUT_TYPES
    assert set(remote.MOVING) == set(quick_run.MOVING)


FINALS = {
    "succeeded": (view(status="completed", phase="succeeded"), {"succeeded": 2}),
    "counted-from-results": (view(status="completed", phase="succeeded"), None),
    "failed": (
        view(status="completed", phase="failed", error="2 failed", error_type="Conflict"),
        {"failed": 1, "succeeded": 1},
    ),
    "no-phase-no-release": (
        view(status="completed", phase=None, revision=None, operation="destroy"),
        {},
    ),
}
RESULTS = {
    "none": {},
    "succeeded": {
        "x:1": {"id": "x:1", "action": "Create", "status": "succeeded", "error": None},
        "x:2": {"id": "x:2", "action": "", "status": "succeeded", "error": None},
    },
    "failed": {
        "x:2": {"id": "x:2", "action": "Update", "status": "succeeded", "error": None},
        "x:1": {"id": "x:1", "action": "Create", "status": "failed", "error": "no [route]"},
    },
}


@pytest.mark.parametrize("results", list(RESULTS))
@pytest.mark.parametrize("final", list(FINALS))
def test_the_json_built_by_hand_is_the_operation_result_s(final: str, results: str) -> None:
    """``quick_run.result_data`` is ``RemoteRun.result(view, changes).model_dump(mode="json")``
    of the same final view, preview, node results and counts."""
    from stackflow.api.models import RunView
    from stackflow.cli import quick_run
    from stackflow.cli.output import OutputFormat
    from stackflow.cli.remote import RemoteRun
    from stackflow.core.refs import StackRef
    from stackflow.temporal.operation import NodeResult

    final_view, counts = FINALS[final]
    nodes = {
        rid: {**fields, "error_type": "Conflict" if fields["error"] else None}
        for rid, fields in RESULTS[results].items()
    }
    changes = PREVIEWS["drift-and-more"]

    remote = RemoteRun(None, StackRef("p", "w"), "ApplyWorkflow", OutputFormat.json)  # type: ignore[arg-type]
    remote.results = {rid: NodeResult(**fields) for rid, fields in nodes.items()}
    remote.counts = counts
    model = remote.result(RunView.model_validate(final_view), changes).model_dump(mode="json")
    built = quick_run.result_data("p", "w", final_view, changes, nodes, counts)
    assert built == model
    assert json.dumps(built, sort_keys=True) == json.dumps(model, sort_keys=True)


@pytest.mark.parametrize(
    "name,options",
    [("succeeded", ("-o", "json")), ("succeeded", ()), ("nodes-failed", ("-o", "json"))],
)
def test_quick_apply_imports_neither_typer_pydantic_httpx_temporalio_nor_sqlalchemy(
    fake_api: FakeApi, tmp_path: Path, name: str, options: tuple[str, ...]
) -> None:
    import os

    events, final, preview = RUNS_OF[name]
    started_run(fake_api, events, final, preview)
    env = {
        "PATH": "/usr/bin:/bin",
        "STACKFLOW_API_URL": fake_api.url,
        "STACKFLOW_API_TOKEN": "t0ken",
        "COLUMNS": "80",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    done = run_main(*run_args(tmp_path, "apply", "--yes", *options), env=env)
    assert done.returncode == (1 if name == "nodes-failed" else 0), done.stderr[-2000:]
    modules = imported(done.stderr)
    assert "stackflow.cli.quick_run" in modules
    for top in NEVER_ON_THE_QUICK_PATH:
        assert not {m for m in modules if m == top or m.startswith(top + ".")}, top
    assert f"{RUN}/events?after=0" in fake_api.seen
    if options:
        assert json.loads(done.stdout)["phase"] == final.get("phase", "succeeded")
    else:
        assert "apply p/w: release 4 succeeded" in done.stdout
        assert "Plan: " in done.stdout  # the change table and outcome off a terminal:
        assert not {m for m in modules if m == "rich" or m.startswith("rich.")}  # no rich
    if name == "nodes-failed":
        assert done.stderr.splitlines()[-1] == "Error: 2 node(s) failed"


@pytest.mark.parametrize("command", ["apply", "destroy"])
def test_a_start_refused_because_the_stack_is_held_ends_there_with_exit_3(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """A 409 ``stack-locked`` is an answer of that moment: the quick path ends with it (exit
    3 and the problem's line, as the typer command ends), and never hands the start to the
    typer command, which sent it again and, once the other run had ended, started a second
    run that exited 0 (two concurrent applies through the API both succeeded)."""
    problem = {
        "type": "urn:stackflow:problem:stack-locked",
        "detail": "stack p/w already has an operation running; wait or `stackflow status`",
    }
    events, final, preview = RUNS_OF["succeeded"]
    started_run(fake_api, events, final, preview)  # a start sent again would run and exit 0
    fake_api.pages[f"POST {RUNS}"] = (409, problem)
    args = run_args(tmp_path, command, "--yes", "-o", "json")
    code = quick.answer(args)
    got = capsys.readouterr()
    assert code == 3, (code, got.err)
    assert fake_api.seen == [f"POST {RUNS}"]
    assert got.out == "" and got.err.strip() == f"Error: {problem['detail']}"
    load_commands()
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, result.stdout, result.stderr) == (code, got.out, got.err)
