"""The CLI rides out a Temporal outage, and never prints a traceback for a connection error.

These tests start their OWN Temporal dev server (free ports, a db file in tmp so its state
survives a restart) and their own worker: the server is SIGKILLed in the middle of an apply
and started again on the same ports and db. The shared services on 7233 are never touched.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.refs import StackRef
from stackflow.temporal.client import quiet_runtime
from stackflow.temporal.codec import data_converter
from stackflow.temporal.operation import OperationInput, OperationResult, workflow_id_for
from tests.integration.conftest import REPO, WorkerProcess
from tests.integration.opshelp import (
    file_resource,
    new_project,
    start_run,
    wait_phase,
    write_spec,
)

FILES = 150
OUTAGE = 25.0
"""Seconds Temporal stays down: longer than a quiet stream's wait before the CLI asks for the
run (``stackflow.cli.remote.QUIET``, 5 s) and the SDK's own retries of that call (10 s)
together, so the CLI's call fails and the CLI itself must wait the outage out."""
SEARCH_ATTRIBUTES = (
    "StackflowProject=Keyword",
    "StackflowWorkspace=Keyword",
    "StackflowPhase=Keyword",
    "StackflowDrift=Bool",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DevServer:
    """`temporal server start-dev` on its own ports and db file, killable and restartable."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("temporal")
        if binary is None:
            pytest.fail(
                'the `temporal` binary is not on PATH: run `eval "$(make -s env)"` '
                "(after `make setup`)",
                pytrace=False,
            )
        self.binary = binary
        self.root = root
        self.port = free_port()
        self.ui_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = root / "temporal.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> None:
        args = [
            self.binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
            "--port", str(self.port), "--ui-port", str(self.ui_port),
            "--db-filename", str(self.root / "t.db"), "--log-level", "error",
        ]  # fmt: skip
        for attribute in SEARCH_ATTRIBUTES:
            args += ["--search-attribute", attribute]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        asyncio.run(self._wait_ready(timeout))

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"temporal dev server exited; log {self.log}:\n{self._tail()}")
            try:
                client = await Client.connect(self.address, runtime=quiet_runtime())
                listed = await client.operator_service.list_search_attributes(
                    ListSearchAttributesRequest(namespace="default")
                )
                if "StackflowDrift" in listed.custom_attributes:
                    return
            except (RuntimeError, RPCError) as exc:
                last = exc
            await asyncio.sleep(0.2)
        self.kill()
        pytest.fail(f"temporal dev server not ready after {timeout}s ({last}):\n{self._tail()}")

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL the server (and anything it started): no graceful shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = DevServer(tmp_path_factory.mktemp("temporal"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_env(tmp_path: Path, dev_server: DevServer) -> dict[str, str]:
    """A worker's and the CLI's environment on the test's own Temporal: own home, SQLite
    state, task queue; nothing of the shared services."""
    if not dev_server.running():
        dev_server.start()
    env = dict(os.environ)
    for name in ("REDIS_URL", "STACKFLOW_POSTGRES_URL"):
        env.pop(name, None)
    env["TEMPORAL_ADDRESS"] = dev_server.address
    env["TEMPORAL_NAMESPACE"] = "default"
    env["STACKFLOW_HOME"] = str(tmp_path / "home")
    env["STACKFLOW_STATE_URL"] = f"sqlite:///{tmp_path / 'home' / 'state.db'}"
    env["STACKFLOW_TASK_QUEUE"] = f"outage-{uuid.uuid4().hex[:10]}"
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("STACKFLOW_ONPREM_ROOTS", tempfile.gettempdir())
    return env


@pytest.fixture
def own_worker(tmp_path: Path, own_env: dict[str, str]) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(tmp_path, own_env["STACKFLOW_TASK_QUEUE"], own_env)
    worker.start()
    yield worker
    worker.stop()


def cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "stackflow"), *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class TtyStderr:
    """The CLI with stderr on a pseudo-terminal (as a person runs it, so it says what it
    waits for) and stdout on a pipe."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "stackflow"), *args],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError:  # EIO: the CLI closed the terminal
                return
            if not data:
                return
            self._chunks.append(data)

    def stderr_so_far(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_stderr(self, text: str, timeout: float = 60) -> None:
        """Block until the CLI has written ``text`` on stderr (fail if it ends first)."""
        deadline = time.monotonic() + timeout
        while text not in self.stderr_so_far():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                if self.proc.poll() is None:
                    self.proc.kill()
                out, err = self.communicate(timeout=10)
                pytest.fail(
                    f"no {text!r} from the CLI (exit {self.proc.returncode}):\n{out}\n{err}"
                )
            time.sleep(0.05)

    def communicate(self, timeout: float) -> tuple[str, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(timeout=10)
        os.close(self._master)
        err = b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")
        return out, err


def files_spec(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "files"
    resources = [file_resource(root / f"f{i:03d}", f"content {i}\n") for i in range(FILES)]
    return root, write_spec(tmp_path / "spec.yaml", resources)


def wait_files(root: Path, at_least: int, proc: subprocess.Popen[Any]) -> int:
    """Block until ``at_least`` files are on disk (the run is applying), or fail if the CLI
    ended first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        count = len(list(root.iterdir())) if root.is_dir() else 0
        if count >= at_least:
            return count
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the CLI ended before the outage (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.05)
    pytest.fail(f"fewer than {at_least} files in {root} after 120s")


def assert_all_files(root: Path) -> None:
    assert sorted(p.name for p in root.iterdir()) == [f"f{i:03d}" for i in range(FILES)]
    for i in range(FILES):
        assert (root / f"f{i:03d}").read_text() == f"content {i}\n"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def test_apply_rides_out_a_temporal_restart_and_exits_with_the_runs_result(
    tmp_path: Path, dev_server: DevServer, own_env: dict[str, str], own_worker: WorkerProcess
) -> None:
    project = new_project()
    root, spec = files_spec(tmp_path)
    cli_run = TtyStderr(
        own_env, "apply", "-f", str(spec), "-p", project, "--yes",
        "--max-concurrency", "1", "--unavailable-timeout", "120",
    )  # fmt: skip
    proc = cli_run.proc
    try:
        wait_files(root, 10, proc)
        dev_server.kill()
        on_disk = len(list(root.iterdir()))
        assert on_disk < FILES, "the outage must come in the middle of the apply"
        time.sleep(OUTAGE)
        assert proc.poll() is None, "the CLI must wait out the outage"
        dev_server.start()
        out, err = cli_run.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    # it saw the outage (its calls failed) and said so, then went on
    assert f"cannot reach Temporal at {dev_server.address}" in err, err
    assert "answers again; continuing" in err, err
    assert "Error:" not in err, err
    assert f"{project}/default: release 1 succeeded" in out, out
    assert f"{FILES} succeeded" in out, out
    assert_all_files(root)


def test_status_and_approve_wait_for_temporal_to_come_back(
    tmp_path: Path, dev_server: DevServer, own_env: dict[str, str], own_worker: WorkerProcess
) -> None:
    """Steering during an outage: `status` and `approve` started while Temporal is down wait
    for it, then do their work (exit 0)."""
    project = new_project()
    root = tmp_path / "files"
    spec = {"resources": [file_resource(root / f"f{i}", f"content {i}\n") for i in range(3)]}

    async def start() -> None:
        client = await Client.connect(
            dev_server.address, data_converter=data_converter(), runtime=quiet_runtime()
        )
        handle = await start_run(client, own_env, OperationInput(project=project, spec=spec))
        await wait_phase(handle, "awaitingApproval")

    asyncio.run(start())
    waiting = f"cannot reach Temporal at {dev_server.address}"

    dev_server.kill()
    status = TtyStderr(own_env, "status", "-p", project, "-o", "json")
    status.wait_stderr(waiting)  # it found Temporal down and waits
    dev_server.start()
    out, err = status.communicate(timeout=120)
    assert status.proc.returncode == 0, f"exit {status.proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err and "answers again" in err, err
    assert json.loads(out)["phase"] == "awaitingApproval", out

    dev_server.kill()
    approve = TtyStderr(own_env, "approve", "-p", project, "--reason", "after the outage")
    approve.wait_stderr(waiting)
    dev_server.start()
    out, err = approve.communicate(timeout=120)
    assert approve.proc.returncode == 0, f"exit {approve.proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err and "answers again" in err, err

    async def outcome() -> OperationResult:
        client = await Client.connect(
            dev_server.address, data_converter=data_converter(), runtime=quiet_runtime()
        )
        handle = client.get_workflow_handle(
            workflow_id_for(StackRef(project, "default")), result_type=OperationResult
        )
        result: OperationResult = await asyncio.wait_for(handle.result(), timeout=120)
        return result

    result = asyncio.run(outcome())
    assert result.phase == "succeeded", result.error
    assert sorted(p.name for p in root.iterdir()) == ["f0", "f1", "f2"]


def test_apply_gives_up_after_unavailable_timeout_with_one_line_and_the_run_goes_on(
    tmp_path: Path, dev_server: DevServer, own_env: dict[str, str], own_worker: WorkerProcess
) -> None:
    project = new_project()
    root, spec = files_spec(tmp_path)
    proc = cli(
        own_env, "apply", "-f", str(spec), "-p", project, "--yes",
        "--max-concurrency", "1", "--unavailable-timeout", "3",
    )  # fmt: skip
    try:
        wait_files(root, 10, proc)
        dev_server.kill()
        assert len(list(root.iterdir())) < FILES, "the outage must come in the middle"
        out, err = proc.communicate(timeout=120)  # while Temporal is still down
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        dev_server.start()
    assert proc.returncode == 1, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == error_lines(err), err
    [line] = error_lines(err)
    assert f"cannot reach Temporal at {dev_server.address}" in line, line
    assert "the run continues on the server" in line, line
    assert f"stackflow status --project {project} --workspace default" in line, line

    # the run went on once Temporal was back, and the CLI follows it again
    async def outcome() -> OperationResult:
        client = await Client.connect(
            dev_server.address, data_converter=data_converter(), runtime=quiet_runtime()
        )
        handle = client.get_workflow_handle(
            workflow_id_for(StackRef(project, "default")), result_type=OperationResult
        )
        result: OperationResult = await asyncio.wait_for(handle.result(), timeout=300)
        return result

    result = asyncio.run(outcome())
    assert result.phase == "succeeded", result.error
    assert_all_files(root)


CLOSED_PORT_COMMANDS = (
    ("status", "-p", "p"),
    ("approve", "-p", "p"),
    ("cancel", "-p", "p"),
    ("drift", "check", "-p", "p"),
    ("drift", "unschedule", "-p", "p"),
)


@pytest.mark.parametrize("command", CLOSED_PORT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_command_with_temporal_unreachable_is_one_error_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = dict(os.environ)
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    env["STACKFLOW_HOME"] = str(tmp_path / "home")
    began = time.monotonic()
    proc = cli(env, *command, "--unavailable-timeout", "1")
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 1, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == error_lines(err) and len(error_lines(err)) == 1, err
    assert f"cannot reach Temporal at {env['TEMPORAL_ADDRESS']}" in err
    assert "TEMPORAL_ADDRESS" in err  # how to fix it
    assert took < 60, f"{took:.1f}s with --unavailable-timeout 1"


def test_apply_with_temporal_unreachable_is_one_error_line(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{free_port()}"
    env["STACKFLOW_HOME"] = str(tmp_path / "home")
    env.pop("STACKFLOW_STATE_URL", None)
    _, spec = files_spec(tmp_path)
    proc = cli(env, "apply", "-f", str(spec), "-p", "p", "--yes", "--unavailable-timeout", "1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert line.startswith("Error: cannot reach Temporal at "), line


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (
            RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""),
            "Error: cannot reach Temporal at 127.0.0.1:1 (tcp connect error)",
        ),
        (
            RPCError("Deadline Exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""),
            "Error: cannot reach Temporal at 127.0.0.1:1 (Deadline Exceeded)",
        ),
        (
            RuntimeError(
                "Failed client connect: Server connection error: tonic::transport::Error("
                'Transport, ConnectError("tcp connect error", Os { code: 111, kind: '
                'ConnectionRefused, message: "Connection refused" }))'
            ),
            "Error: cannot reach Temporal at 127.0.0.1:1 (tcp connect error)",
        ),
        (
            ConnectionRefusedError(111, "Connection refused"),
            "Error: cannot reach Temporal at 127.0.0.1:1 (connection refused)",
        ),
        (
            RPCError("namespace nope is not found", RPCStatusCode.NOT_FOUND, b""),
            "Error: Temporal at 127.0.0.1:1 refused the call (NOT_FOUND: namespace nope is not "
            "found)",
        ),
    ],
    ids=["unavailable", "deadline", "connect", "refused", "rpc-other"],
)
def test_a_connection_error_raised_by_any_command_is_one_line_exit_1(
    raised: Exception, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command group maps what a command lets escape, once for every command."""
    from typer.testing import CliRunner

    from stackflow.cli.app import app

    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")

    @app.command("outage-probe", hidden=True)
    def probe() -> None:
        raise raised

    try:
        result = CliRunner().invoke(app, ["outage-probe"])
    finally:
        app.registered_commands.pop()
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(line), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
