"""The CLI in API mode (issue 21): with STACKFLOW_API_URL and STACKFLOW_API_TOKEN set and no
TEMPORAL_ADDRESS, STACKFLOW_STATE_URL or encryption key in its environment (nor a home that
holds a state database), every run, steering and release command goes through a real
`stackflow serve` of this checkout, whose worker and state backend are the test's. The
operations test of the direct CLI runs again unchanged with its CLI calls in API mode."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from tests.integration import test_operations
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import DIRECT_ONLY, cli_json, file_resource, new_project, write_spec

pytestmark = pytest.mark.integration

TOKEN = "cli-api-mode-token"
CALLER = "cli-tester"
Cli = Callable[..., subprocess.CompletedProcess[str]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def api_server(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> Iterator[str]:
    """`stackflow serve` on the test's task queue and state backend (a free port)."""
    tokens = tmp_path / "tokens.json"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(json.dumps([{"name": CALLER, "sha256": digest, "roles": {"*": "approver"}}]))
    env = dict(stack_env, STACKFLOW_API_TOKENS=str(tokens))
    port = free_port()
    log = tmp_path / "api.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stackflow.cli.main", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"stackflow serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            pytest.fail(f"stackflow serve not ready in 60s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def direct(env: dict[str, str]) -> dict[str, str]:
    """``env`` for the CLI in direct mode (`make -s env` exports the dev API's address)."""
    return {k: v for k, v in env.items() if k not in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN")}


def api_env(env: dict[str, str], url: str, home: Path) -> dict[str, str]:
    """``env`` as a laptop in API mode has it: the API's address and token, nothing else."""
    out = {k: v for k, v in env.items() if k not in DIRECT_ONLY}
    home.mkdir(parents=True, exist_ok=True)
    out.update(STACKFLOW_HOME=str(home), STACKFLOW_API_URL=url, STACKFLOW_API_TOKEN=TOKEN)
    return out


@pytest.fixture
def api_cli(tmp_path: Path, api_server: str) -> Cli:
    """``run_cli`` with the CLI in API mode (same signature)."""

    def cli(env: dict[str, str], *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return run_cli(api_env(env, api_server, tmp_path / "laptop"), *args, **kw)

    return cli


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def apply_waiting(spec: Path, project: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``stackflow apply`` of ``spec`` through the API, waiting for approval (no terminal to
    ask on), its event stream on stdout as NDJSON."""
    return subprocess.Popen(
        [
            str(REPO / ".venv/bin/stackflow"),
            "apply",
            "-f",
            str(spec),
            "-p",
            project,
            "-o",
            "ndjson",
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


async def test_the_operations_flow_passes_in_api_mode(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
    api_cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """test_operations' preview → apply → preview → no-op apply → update → destroy → table
    preview, every CLI call through the API."""
    monkeypatch.setattr(test_operations, "run_cli", api_cli)
    await test_operations.test_preview_apply_update_destroy_through_the_cli(
        tmp_path, stack_env, worker_process, temporal_client
    )


def test_approve_from_a_second_command_status_and_a_busy_stack(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    project = new_project()
    root = tmp_path / "files"
    spec = write_spec(
        tmp_path / "spec.yaml", [file_resource(root / f"f{i}.txt", f"{i}\n") for i in range(3)]
    )
    env = api_env(stack_env, api_server, tmp_path / "laptop")
    # an apply that waits for approval, its event stream on stdout
    waiting = apply_waiting(spec, project, env)
    try:
        deadline = time.monotonic() + 90
        while True:
            status = api_cli(stack_env, "status", "-p", project, "-o", "json")
            if status.returncode == 0 and cli_json(status)["phase"] == "awaitingApproval":
                break
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.5)
        view = cli_json(status)
        assert view["total"] == 3 and view["changes"]["summary"]["Create"] == 3
        assert view["ui"].endswith("/workflows/stackflow%2F" + project + "%2Fdefault")
        table = _ok(api_cli(stack_env, "status", "-p", project))
        assert "awaitingApproval" in table.stdout
        assert not root.exists()

        busy = _ok(api_cli(stack_env, "apply", "-f", str(spec), "-p", project, "--yes"), 3)
        assert "already has an operation running" in busy.stderr

        approved = _ok(api_cli(stack_env, "approve", "-p", project, "--reason", "lgtm"))
        assert approved.stdout.strip() == f"approved by {CALLER}"
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["stream"] == "stackflow.events" and lines[0]["version"] == 1
    types = [line["type"] for line in lines[1:]]
    assert "approval_wait" in types and types[-1] == "run_complete"
    assert types.count("apply_complete") == 3
    assert lines[-1]["status"] == "succeeded"
    assert sorted(p.name for p in root.iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]

    # nothing runs any more: the steering commands say so (exit 1)
    idle = _ok(api_cli(stack_env, "approve", "-p", project), 1)
    assert "has no running operation (its last run is completed" in idle.stderr
    _ok(api_cli(stack_env, "status", "-p", project), 1)


def test_releases_and_outputs_read_the_same_through_the_api(
    tmp_path: Path, stack_env: dict[str, str], api_cli: Cli
) -> None:
    project = new_project()
    root = tmp_path / "files"
    first = write_spec(tmp_path / "a.yaml", [file_resource(root / "a.txt", "1\n")])
    second = write_spec(
        tmp_path / "b.yaml",
        [file_resource(root / "a.txt", "2\n"), file_resource(root / "b.txt", "b\n")],
    )
    _ok(api_cli(stack_env, "apply", "-f", str(first), "-p", project, "--yes"))
    _ok(api_cli(stack_env, "apply", "-f", str(second), "-p", project, "--yes"))
    for args in (
        ("release", "list", "-p", project, "-o", "json"),
        ("release", "show", "-p", project, "-o", "json"),
        ("release", "show", "-p", project, "-r", "1", "-o", "json"),
        ("release", "diff", "1", "2", "-p", project, "-o", "json"),
        ("output", "-p", project),
        ("output", f"onprem:File:{root / 'a.txt'}.content", "-p", project),
    ):
        direct_out = _ok(run_cli(direct(stack_env), *args))
        through = _ok(api_cli(stack_env, *args))
        assert through.stdout == direct_out.stdout, args
    for args in (("release", "list", "-p", project), ("release", "diff", "1", "2", "-p", project)):
        assert _ok(api_cli(stack_env, *args)).stdout.strip()
    missing = _ok(api_cli(stack_env, "release", "show", "-p", new_project()), 1)
    assert "has no releases" in missing.stderr


def test_commands_that_need_temporal_or_the_state_refuse_and_a_token_is_needed(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    spec = write_spec(tmp_path / "s.yaml", [file_resource(tmp_path / "v.txt", "v\n")])
    refused = _ok(api_cli(stack_env, "policy", "eval", "-f", str(spec), "-p", "x"), 2)
    assert "does not go through the HTTP API: unset STACKFLOW_API_URL" in refused.stderr
    assert "Traceback" not in refused.stderr
    # the schema of the API's backend is its workers' to migrate: the line says what to do
    migrate = _ok(api_cli(stack_env, "state", "migrate"), 2)
    assert "migrated by its workers when they start" in migrate.stderr
    # unlock goes through the API (test_api_parity): this stack has nothing to unlock
    unlock = _ok(api_cli(stack_env, "release", "unlock", "-p", "x"), 1)
    assert unlock.stderr == "Error: stack x/default has no releases\n"
    # what only this machine's state backend holds is refused by name
    full = _ok(api_cli(stack_env, "preview", "-f", str(spec), "-p", "x", "--full"), 2)
    assert "--full is not available through the HTTP API" in full.stderr
    # still local: validate needs nothing but the file
    assert _ok(api_cli(stack_env, "validate", "-f", str(spec))).stdout.startswith("valid")

    env = api_env(stack_env, api_server, tmp_path / "laptop")
    del env["STACKFLOW_API_TOKEN"]
    no_token = _ok(run_cli(env, "status", "-p", "x"), 2)
    assert "STACKFLOW_API_TOKEN is not" in no_token.stderr
    env["STACKFLOW_API_TOKEN"] = "wrong"
    unknown = _ok(run_cli(env, "status", "-p", "x"), 2)
    assert unknown.stderr.startswith("Error: ") and len(unknown.stderr.splitlines()) == 1
    env["STACKFLOW_API_URL"] = f"http://127.0.0.1:{free_port()}"
    down = _ok(run_cli(env, "release", "list", "-p", "x"), 1)
    assert "unreachable" in down.stderr and "Traceback" not in down.stderr


def test_status_and_help_start_without_the_engine(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    """`stackflow --help`, and in API mode `stackflow status` of a running operation and
    `stackflow preview`, import neither the Temporal SDK nor typer's rich help, the
    Kubernetes client or SQLAlchemy (nor typer, pydantic or httpx: the option table's
    parser and the typed client on the standard library), and print what the same command
    parsed by typer prints (issues 25, 42; tests/unit/test_cli_startup.py holds the rest)."""
    project = new_project()
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(tmp_path / "files" / "a", "a\n")])
    env = api_env(stack_env, api_server, tmp_path / "laptop")
    never = ("temporalio", "typer", "kubernetes", "sqlalchemy", "pydantic", "httpx")

    def startup(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "stackflow.cli.main", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
        modules = {line.rsplit("|", 1)[1].strip() for line in lines}
        leaked = {m for m in modules for top in never if m == top or m.startswith(top + ".")}
        assert not leaked, (args, sorted(leaked))
        assert "typer.rich_utils" not in modules
        return done, modules

    helped, _ = startup("--help")
    assert helped.returncode == 0 and "Exit codes: 0 ok" in helped.stdout
    waiting = apply_waiting(spec, project, env)
    try:
        deadline = time.monotonic() + 90
        while True:
            shown, modules = startup("status", "-p", project, "-o", "json")
            assert "stackflow.cli.remote" in modules and "stackflow.cli.steer" not in modules
            if shown.returncode == 0 and json.loads(shown.stdout)["phase"] == "awaitingApproval":
                break
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        table, _ = startup("status", "-p", project)
        assert table.returncode == 0 and "awaitingApproval" in table.stdout
        # parsed by typer (the table's parser leaves ``-pNAME`` to it): the same output
        for quick_one, args in ((shown, ("-o", "json")), (table, ())):
            typer_one = _ok(api_cli(stack_env, "status", f"-p{project}", *args))
            if args:
                assert json.loads(typer_one.stdout) == json.loads(quick_one.stdout)
            else:
                assert typer_one.stdout == quick_one.stdout
        _ok(api_cli(stack_env, "approve", "-p", project))
        _, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    idle, _ = startup("status", "-p", project)
    assert idle.returncode == 1 and "has no running operation" in idle.stderr

    # a preview through the API: no engine either, and what the typer command prints
    changed = write_spec(
        tmp_path / "changed.yaml", [file_resource(tmp_path / "files" / "a", "b\n")]
    )
    for args in ((), ("-o", "json")):
        quick_one, _ = startup("preview", "-f", str(changed), "-p", project, *args)
        assert quick_one.returncode == 0, quick_one.stderr
        typer_one = _ok(api_cli(stack_env, "preview", f"-f{changed}", "-p", project, *args))
        assert quick_one.stdout == typer_one.stdout
        assert "Update" in quick_one.stdout


# ---- `stackflow apply --yes` and `stackflow destroy --yes` without typer -----------------------
NEVER_QUICK = ("temporalio", "typer", "kubernetes", "sqlalchemy", "pydantic", "httpx")
VOLATILE = {"run_id", "ui", "at", "created_at", "modified_at", "started_at", "ended_at"}
ASKS = """package stackflow

import rego.v1

require_approval contains {"msg": "creates a file", "resource": c.id} if {
	some c in input.changes
	c.action == "Create"
}
"""


def with_imports(
    env: dict[str, str], *args: str, timeout: float = 180
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The CLI as ``python -X importtime -m stackflow.cli.main``: its run, with the import
    lines taken out of stderr, and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "stackflow.cli.main", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = done.stderr.splitlines(keepends=True)
    modules = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    done.stderr = "".join(line for line in lines if not line.startswith("import time:"))
    return done, modules


def quick(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    """A command parsed by the option table and run through the typed client: without the
    engine, typer, pydantic or httpx."""
    done, modules = with_imports(env, *args)
    _ok(done, code)
    leaked = {m for m in modules for top in NEVER_QUICK if m == top or m.startswith(top + ".")}
    assert not leaked, (args, sorted(leaked))
    assert "stackflow.cli.remote" in modules
    return done


def normalised(text: str, project: str, other: str) -> Any:
    """A command's JSON with ``other`` (the project of the typer command's runs) read as
    ``project``, the run ids, UI links and timestamps blanked and the node results in id
    order (they come in the order the nodes ended)."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "…" if k in VOLATILE else clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    data = clean(json.loads(text.replace(other, project)))
    data["results"].sort(key=lambda r: r["id"])
    return data


def table_of(text: str, project: str, other: str) -> str:
    """A command's table with ``other`` read as ``project`` and the run id of its UI link
    blanked."""
    lines = text.replace(other, project).splitlines()
    return "\n".join(
        line.rsplit("/", 1)[0] + "/…" if "Temporal UI:" in line else line for line in lines
    )


def test_apply_and_destroy_yes_answer_quickly_and_print_what_the_typer_commands_print(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    """The same sequence on two stacks of the same files, one parsed by the option table,
    one by typer (the table's parser leaves ``-pNAME`` to it): apply and destroy as JSON,
    then as tables; each prints what the other prints."""
    root = tmp_path / "files"
    spec = write_spec(
        tmp_path / "spec.yaml",
        [
            file_resource(root / "a.txt", "a\n"),
            file_resource(root / "b.txt", "b\n", deps=[f"onprem:File:{root / 'a.txt'}"]),
            file_resource(root / "c.txt", "c\n"),
        ],
    )
    env = api_env(stack_env, api_server, tmp_path / "laptop")
    mine, theirs = new_project(), new_project()
    steps = (
        ("apply", "-f", str(spec), "-o", "json"),
        ("destroy", "-o", "json"),
        ("apply", "-f", str(spec), "--detail"),
        ("destroy",),
    )
    printed: dict[str, list[str]] = {mine: [], theirs: []}
    for command, *rest in steps:
        done = quick(env, command, "-p", mine, "--yes", *rest)
        printed[mine].append(done.stdout)
        assert done.stderr == ""
        assert (root / "b.txt").exists() == (command == "apply")
    for command, *rest in steps:
        done = _ok(api_cli(stack_env, command, f"-p{theirs}", "--yes", *rest))
        printed[theirs].append(done.stdout)
    for step, ours, typers in zip(steps, printed[mine], printed[theirs], strict=True):
        if "json" in step:
            assert normalised(ours, mine, theirs) == normalised(typers, mine, theirs), step
            data = json.loads(ours)
            assert data["phase"] == "succeeded" and data["counts"] == {"succeeded": 3}
            assert data["release"]["revision"] == data["revision"]
        else:
            assert table_of(ours, mine, theirs) == table_of(typers, mine, theirs), step
            assert f"{step[0]} {mine}/default: release" in ours and "3 succeeded" in ours


def test_a_failing_apply_ends_the_same_parsed_by_the_table_or_by_typer(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    """An OnPrem path outside the worker's roots: the same JSON, the same line on stderr
    and the same exit code (2: bad input) as the typer command's."""
    outside = Path("/var/lib/stackflow-cli-outside")
    spec = write_spec(
        tmp_path / "bad.yaml",
        [file_resource(outside / "x.txt", "x\n"), file_resource(tmp_path / "ok.txt", "ok\n")],
    )
    env = api_env(stack_env, api_server, tmp_path / "laptop")
    mine, theirs = new_project(), new_project()
    ours = quick(env, "apply", "-f", str(spec), "-p", mine, "-y", "-o", "json", code=2)
    typers = _ok(api_cli(stack_env, "apply", "-f", str(spec), f"-p{theirs}", "-y", "-o", "json"), 2)
    assert ours.stderr == typers.stderr
    assert ours.stderr.startswith("Error: ") and len(ours.stderr.splitlines()) == 1
    assert "outside this worker's OnPrem roots" in ours.stderr
    assert normalised(ours.stdout, mine, theirs) == normalised(typers.stdout, mine, theirs)
    assert json.loads(ours.stdout)["phase"] == "failed" and not outside.exists()
    table = quick(env, "apply", "-f", str(spec), "-p", mine, "-y", code=2)
    assert table.stderr == ours.stderr and "apply " + mine in table.stdout


def test_a_run_a_policy_asks_an_approver_for_waits_for_the_approval(
    tmp_path: Path, stack_env: dict[str, str], api_server: str, api_cli: Cli
) -> None:
    """The project's policy asks for an approver: `stackflow apply --yes` says so, waits
    for the approval of another command and reports the run, without typer."""
    project = new_project()
    bundle = tmp_path / "policy"
    bundle.mkdir()
    (bundle / "asks.rego").write_text(ASKS)
    _ok(api_cli(stack_env, "policy", "push", "-p", project, str(bundle)))
    root = tmp_path / "files"
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(root / "a.txt", "a\n")])
    env = api_env(stack_env, api_server, tmp_path / "laptop")
    args = ["-X", "importtime", "-m", "stackflow.cli.main", "apply", "-f", str(spec)]
    waiting = subprocess.Popen(
        [sys.executable, *args, "-p", project, "--yes", "-o", "json"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            status = api_cli(stack_env, "status", "-p", project, "-o", "json")
            if status.returncode == 0 and cli_json(status)["phase"] == "awaitingApproval":
                break
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.3)
        assert not root.exists()
        _ok(api_cli(stack_env, "approve", "-p", project, "--reason", "ok"))
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    lines = err.splitlines()
    modules = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    said = [line for line in lines if not line.startswith("import time:")]
    assert waiting.returncode == 0, said
    assert "stackflow.cli.remote" in modules and "typer" not in modules
    assert said == [
        f"policy requires an approver: project/asks.rego: creates a file; waiting for "
        f"`stackflow approve -p {project} -w default`"
    ]
    result = json.loads(out)
    assert result["phase"] == "succeeded" and result["counts"] == {"succeeded": 1}
    assert [r["id"] for r in result["results"]] == [f"onprem:File:{root / 'a.txt'}"]
    assert result["release"]["approval"]["by"] == CALLER
    assert (root / "a.txt").read_text() == "a\n"
