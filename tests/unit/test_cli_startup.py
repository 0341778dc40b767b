"""How `stackflow` starts (issues 25 and 42): the top-level help comes from the static command
table without typer, rich or any engine module, the table lists exactly what the command
modules register, and in API mode every command of the option table
(:data:`stackflow.cli.table.COMMANDS`) runs on the standard library alone: parsed from the
table (as typer parses it), through the typed client, with the exit codes of its failures
(see tests/integration/test_cli_api_mode.py for them against a real API server).

No timing here: what is asserted is what gets imported."""

from __future__ import annotations

import io
import json
import os
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

from stackflow.cli import table
from stackflow.cli.app import app
from stackflow.cli.commands import COMMANDS, EXIT_CODES_HELP, render_help
from stackflow.cli.main import answer, load_commands
from stackflow.cli.plain_render import plain_table
from stackflow.client.transport import PROXY_ENV
from stackflow.client.types import PHASES

REPO = Path(__file__).resolve().parents[2]
NEVER_FOR_HELP = ("temporalio", "typer", "rich", "pydantic", "kubernetes", "sqlalchemy", "httpx")
NEVER_THROUGH_THE_API = ("typer", "pydantic", "httpx", "temporalio", "sqlalchemy", "kubernetes")


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
    assert sorted(e.name for e in COMMANDS) == sorted(registered)  # listed in the table's order
    for entry in COMMANDS:
        command = registered[entry.name]
        assert entry.help == first_paragraph(command.help), entry.name
        callbacks = [command.callback] if command.callback else []
        callbacks += [c.callback for c in getattr(command, "commands", {}).values()]
        assert entry.module in {c.__module__ for c in callbacks if c is not None}, entry.name


def test_the_cli_default_concurrency_is_the_runs_own() -> None:
    """`--max-concurrency` unset sends the table's default; a run started any other way (the
    API, a bare Temporal client) takes the model's: the two are one number."""
    from stackflow.api.models import RunRequest
    from stackflow.temporal.operation import MAX_CONCURRENCY_DEFAULT, OperationInput
    from stackflow.temporal.stack_set import SetInput

    assert table.CONCURRENCY.default == MAX_CONCURRENCY_DEFAULT
    assert OperationInput(project="p").max_concurrency == MAX_CONCURRENCY_DEFAULT
    assert SetInput.model_fields["max_concurrency"].default == MAX_CONCURRENCY_DEFAULT
    assert RunRequest.model_fields["max_concurrency"].default == MAX_CONCURRENCY_DEFAULT


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
    assert "stackflow.cli.commands" in modules
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


SPEC = """resources:
  - id: onprem:File:/tmp/sf-cli/a.txt
    type: OnPrem
    attributes: {kind: File, path: /tmp/sf-cli/a.txt, mode: "0644", content: "a\\n"}
"""
PREVIEW_ID = "0198a0c2-0000-7000-8000-00000000000f"
RUNS = "/v1/stacks/p/w/runs"


def change(rid: str, action: str, **fields: Any) -> dict[str, Any]:
    return {"id": rid, "type": "OnPrem", "action": action, "drift": False, "diff": [], **fields}


PREVIEWS = {
    "plain": {
        "changes": [
            change(
                "onprem:File:/tmp/sf-cli/a.txt",
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
    "odd-types": {  # not as the plain renderer reads it: rendered by the engine's model
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


RUN = f"{RUNS}/{RUN_ID}"
T = "2025-01-01T00:00:00.123456+00:00"


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
    if command in ("destroy", "refresh"):
        return [command, "-p", "p", "-w", "w", *options]
    if command == "rollback":
        return [command, "-p", "p", "-w", "w", "--to", "3", *options]
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    return [command, "-f", str(spec), "-p", "p", "-w", "w", *options]


def api_env(fake: FakeApi) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "STACKFLOW_API_URL": fake.url,
        "STACKFLOW_API_TOKEN": "t0ken",
        "COLUMNS": "80",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }


def steered(fake: FakeApi, action: str) -> None:
    fake.pages = {
        f"{RUNS}?page_size=20": (200, {"runs": [summary(RUN_ID, "running")]}),
        RUN: (200, view()),
        f"POST {RUN}/{action}": (
            200,
            {"run_id": RUN_ID, "workflow_id": "stackflow/p/w", "action": action, "result": "ok"},
        ),
    }


API_COMMANDS = [
    ("status", ()),
    ("status", ("-o", "json")),
    ("approve", ("--reason", "fine")),
    ("cancel", ()),
    ("preview", ()),
    ("preview", ("-o", "json", "--no-detail")),
    ("apply", ("--yes",)),
    ("apply", ("-y", "-o", "json")),
    ("destroy", ("--yes", "--output=json")),
    ("apply", ("--yes", "-o", "ndjson")),
    ("rollback", ("--yes",)),
    ("refresh", ("--yes", "-o", "json")),
    ("events", ()),
    ("events", ("-o", "json", "--after", "2")),
]


@pytest.mark.parametrize("command,options", API_COMMANDS, ids=str)
def test_api_mode_commands_import_neither_typer_pydantic_httpx_temporalio_nor_sqlalchemy(
    fake_api: FakeApi, tmp_path: Path, command: str, options: tuple[str, ...]
) -> None:
    """The rule for every command of the option table in API mode: parsed from the table,
    through the typed client on ``http.client``, reported without typer, pydantic, httpx,
    the Temporal SDK or SQLAlchemy; off a terminal a table is written without rich."""
    if command == "events":
        events, final, preview = RUNS_OF["succeeded"]
        started_run(fake_api, events, final, preview)
        fake_api.pages[f"{RUNS}?page_size=1"] = (200, {"runs": [summary(RUN_ID, "completed")]})
        for after in (0, 2):
            stream = fake_api.pages[f"{RUN}/events?after={after}"]
            fake_api.pages[f"{RUN}/events?after={after}&wait=false"] = stream
        args = [command, "-p", "p", "-w", "w", *options]
    elif command in ("status", "approve", "cancel"):
        steered(fake_api, command)
        args = [command, "-p", "p", "-w", "w", *options]
    elif command == "preview":
        started_preview(fake_api, PREVIEWS["unchanged"])
        args = run_args(tmp_path, command, *options)
    else:
        events, final, preview = RUNS_OF["destroyed" if command == "destroy" else "succeeded"]
        started_run(fake_api, events, {**final, "operation": command}, preview)
        args = run_args(tmp_path, command, *options)
    done = run_main(*args, env=api_env(fake_api))
    assert done.returncode == 0, done.stderr[-2000:]
    modules = imported(done.stderr)
    assert "stackflow.client.http" in modules and "stackflow.cli.app" not in modules
    for top in NEVER_THROUGH_THE_API:
        assert not {m for m in modules if m == top or m.startswith(top + ".")}, top
    if "ndjson" in options:
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert lines[0]["stream"] == "stackflow.events" and lines[-1]["type"] == "run_complete"
    elif "json" in " ".join(options):
        json.loads(done.stdout)
    else:
        assert not {m for m in modules if m == "rich" or m.startswith("rich.")}
    if command in ("apply", "rollback") and not options[1:]:
        assert f"{command} p/w: release 4 succeeded" in done.stdout
        assert "Plan: " in done.stdout


PARSED = [
    ("apply", ["-f", "s.yaml", "-p", "p", "--yes"]),
    ("apply", ["--file=s.yaml", "--project", "p", "-w", "w", "-o", "json", "--detail", "-y"]),
    ("apply", ["-f", "-", "-p", "p", "--target", "a*", "--target", "b", "--exclude", "c"]),
    ("apply", ["-f", "s", "-p", "p", "--max-concurrency", "3", "--on-failure", "pause"]),
    ("apply", ["-f", "s", "-p", "p", "--policy", "dir", "--watch", "--unavailable-timeout=5"]),
    ("preview", ["-f", "s", "-p", "p", "--no-detail", "--full", "--ignore-field", "a.b"]),
    ("destroy", ["-p", "p", "-o", "ndjson", "--fail-fast", "--force"]),
    ("rollback", ["-p", "p", "--to", "2", "--yes", "-p", "q"]),
    ("refresh", ["-p", "p", "--detail", "--no-detail"]),
    ("status", ["-p", "p", "--unavailable-timeout", "0"]),
    ("approve", ["-p", "p", "--reason", "ok"]),
    ("cancel", ["-w", "w", "-p", "p"]),
    ("events", ["-p", "p", "--run", "r", "--follow", "--after", "3", "-o", "ndjson"]),
    ("events", ["-p", "p", "--after", "-1"]),
]


@pytest.mark.parametrize("command,args", PARSED, ids=str)
def test_the_table_parses_what_typer_parses(
    monkeypatch: pytest.MonkeyPatch, command: str, args: list[str]
) -> None:
    """Where :func:`stackflow.cli.table.parse` takes a command line, the typer command made
    from the same table calls the same function with the same options; where it does not
    (``--force`` is apply's and preview's only), None."""
    from stackflow.cli import verbs

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(verbs, command, calls.append)
    parsed = table.parse(table.BY_NAME[command], args)
    load_commands()
    result = CliRunner().invoke(app, [command, *args])
    if parsed is None:
        assert result.exit_code == 2 and not calls, result.output
        return
    assert result.exit_code == 0, result.output
    assert calls == [parsed]


@pytest.mark.parametrize(
    "command,args",
    [
        ("status", ["-pp"]),
        ("status", ["-p", "p", "--help"]),
        ("status", ["-w", "w"]),
        ("status", ["-p", "p", "-o", "yaml"]),
        ("status", ["-p", "p", "--unavailable-timeout", "-1"]),
        ("apply", ["-p", "p", "--max-concurrency", "x", "-f", "s"]),
        ("apply", ["-p", "p", "--yes=1", "-f", "s"]),
        ("apply", ["-p", "p", "extra", "-f", "s"]),
        ("rollback", ["-p", "p"]),
    ],
    ids=str,
)
def test_what_the_table_does_not_take_goes_to_typer(command: str, args: list[str]) -> None:
    assert table.parse(table.BY_NAME[command], args) is None


@pytest.mark.parametrize("command", ["apply", "destroy"])
def test_a_start_refused_because_the_stack_is_held_ends_there_with_exit_3(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """A 409 ``stack-locked`` is an answer of that moment: the command ends with it (exit 3
    and the problem's line) and never sends the start again (once the other run had ended,
    a second start would run)."""
    problem = {
        "type": "urn:stackflow:problem:stack-locked",
        "detail": "stack p/w already has an operation running; wait or `stackflow status`",
    }
    events, final, preview = RUNS_OF["succeeded"]
    started_run(fake_api, events, final, preview)
    fake_api.pages[f"POST {RUNS}"] = (409, problem)
    code = answer(run_args(tmp_path, command, "--yes", "-o", "json"))
    got = capsys.readouterr()
    assert code == 3, (code, got.err)
    assert fake_api.seen == [f"POST {RUNS}"]
    assert got.out == "" and got.err.strip() == f"Error: {problem['detail']}"


@pytest.mark.parametrize(
    "name,code,line",
    [
        ("succeeded", 0, None),
        ("no-counts", 0, None),
        ("nodes-failed", 1, "Error: 2 node(s) failed"),
        ("one-bad-input", 2, "Error: x:1: outside the roots"),
        ("failed-in-preview", 2, "Error: preview failed: x"),
        ("workflow-failed", 1, "Error: ApplyWorkflow failed: boom"),
        ("stack-locked", 3, "Error: busy"),
        ("no-release", 0, None),
    ],
)
def test_a_run_ends_with_the_exit_code_of_its_failure(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    code: int,
    line: str | None,
) -> None:
    events, final, preview = RUNS_OF[name]
    started_run(fake_api, events, final, preview)
    assert answer(run_args(tmp_path, "apply", "--yes", "-o", "json")) == code
    got = capsys.readouterr()
    assert (got.err.strip() or None) == line
    if final.get("status", "completed") == "completed":
        data = json.loads(got.out)
        assert data["phase"] == final.get("phase", "succeeded")
        assert data["ui"].endswith(f"/workflows/stackflow%2Fp%2Fw/{RUN_ID}")
        assert (data["release"] is None) == (final.get("revision", 4) is None)
        nodes = [] if name == "failed-in-preview" else ["x:1", "x:2"]
        assert sorted(r["id"] for r in data["results"]) == nodes


def test_a_status_through_the_api_says_when_nothing_runs(
    fake_api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.pages = {f"{RUNS}?page_size=20": (200, {"runs": [summary(RUN_ID, "completed")]})}
    assert answer(["status", "-p", "p", "-w", "w"]) == 1
    assert "has no running operation (its last run is completed" in capsys.readouterr().err
    fake_api.pages = {f"{RUNS}?page_size=20": (200, {"runs": [{"run_id": 1}]})}
    assert answer(["status", "-p", "p", "-w", "w"]) == 1
    assert "unexpected RunPage: runs.0.run_id: not a string" in capsys.readouterr().err


def rich_table(rows: list[tuple[str, str]], width: int) -> str:
    from rich.table import Table

    from stackflow.cli.console import SafeConsole

    out = io.StringIO()
    grid = Table(show_header=False)
    for row in rows:
        grid.add_row(*row)
    SafeConsole(file=out, emoji=False, width=width).print(grid)
    return out.getvalue()


def test_the_plain_status_table_is_what_rich_prints() -> None:
    """Wherever ``plain_table`` lays the status table out itself, it is rich's table to the
    character; elsewhere it leaves it to rich."""
    rnd = random.Random(25)
    laid_out = 0
    for _ in range(3000):
        rows = [
            ("phase", rnd.choice(PHASES)),
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
        plain = plain_table(rows, width)
        if plain is not None:
            laid_out += 1
            assert plain == rich_table(rows, width), (rows, width)
    assert laid_out > 1500  # the plain case is the common one
    assert plain_table([("phase", "a [b]")], 80) is None  # markup: rich's
    assert plain_table([("phase", "wide ✓")], 80) is None
