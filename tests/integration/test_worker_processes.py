"""``stackflow worker --processes 2`` against the real Temporal server: both processes start
on the task queue and serve a run, SIGTERM stops them all, and one that dies takes the others
down with a failing exit code (the service manager restarts the whole)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from tests.integration.conftest import REPO, run_cli
from tests.integration.opshelp import cli_json, expect_exit, file_resource, poll, write_spec


@contextlib.asynccontextmanager
async def supervised(
    env: dict[str, str], log: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """``stackflow worker`` with ``STACKFLOW_WORKER_PROCESSES=2``, once both processes are
    ready: the supervisor and its two processes' pids; all killed at the end if still up."""
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "stackflow.worker"],
        cwd=REPO,
        env={**env, "STACKFLOW_WORKER_PROCESSES": "2"},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        await poll(lambda: _ready(log, 2), timeout=60, what=f"two ready worker processes in {log}")
        yield supervisor, children(log)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        for pid in children(log):  # a killed supervisor leaves them behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def children(log: Path) -> list[int]:
    for line in log.read_text().splitlines():
        if line.startswith("stackflow worker: 2 processes (pids "):
            return [int(p) for p in line.split("pids ")[1].rstrip(")").split(", ")]
    return []


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_two_processes_serve_one_queue_and_stop_together(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    log = tmp_path / "worker.log"
    async with supervised(stack_env, log) as (supervisor, pids):
        assert len(pids) == 2 and supervisor.pid not in pids
        # each prints its ready line once its Temporal worker polls the task queue (the
        # server's list of pollers is per partition: it may name one of them for a while)
        text = log.read_text()
        for index, pid in enumerate(pids, start=1):
            assert f"process {index} of 2, pid {pid})" in text, text
        root = tmp_path / "files"
        files = [file_resource(root / f"f{i:02d}", f"{i}\n") for i in range(40)]
        spec = write_spec(tmp_path / "spec.yaml", files)
        project = f"wp{uuid.uuid4().hex[:8]}"
        command = ("apply", "-f", str(spec), "--project", project, "--yes", "-o", "json")
        applied = cli_json(expect_exit(run_cli(stack_env, *command)))
        assert applied["phase"] == "succeeded"
        assert len(list(root.iterdir())) == 40

        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0
        assert all(gone(pid) for pid in pids)
        assert log.read_text().count("stackflow worker stopping (SIGTERM)") == 2


async def test_a_process_that_dies_takes_the_others_down(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    log = tmp_path / "worker.log"
    async with supervised(stack_env, log) as (supervisor, (first, second)):
        os.kill(first, signal.SIGKILL)
        assert supervisor.wait(timeout=40) == 1
        assert gone(second)
        assert f"process {first} exited with code -9; stopping the others" in log.read_text()


async def _ready(log: Path, count: int) -> bool:
    return log.exists() and log.read_text().count("stackflow worker ready") >= count


async def test_the_processes_stop_when_their_supervisor_is_killed(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    log = tmp_path / "worker.log"
    async with supervised(stack_env, log) as (supervisor, pids):
        supervisor.kill()
        supervisor.wait()
        await poll(lambda: _all_gone(pids), timeout=30, what=f"worker processes {pids} to stop")
        assert log.read_text().count("its supervisor is gone; stopping") == 2


async def _all_gone(pids: list[int]) -> bool:
    return all(gone(pid) for pid in pids)
