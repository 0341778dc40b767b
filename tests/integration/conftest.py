"""Fixtures for tests that run against the real services started by `make up`.

A missing service fails the test with a message naming it and how to start it; nothing
here skips silently.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from stackflow.runtimes.kubernetes.runtime import KubernetesRuntime
from stackflow.temporal.codec import data_converter

REPO = Path(__file__).resolve().parents[2]


def require_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: start the services with `make up` and "
            '`eval "$(make -s env)"` (or run `make test`)',
            pytrace=False,
        )
    return value


def require_port(service: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
            return
    except OSError as exc:
        pytest.fail(
            f"{service} is not reachable at {address} ({exc}); start it with `make up`",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def temporal_address() -> str:
    address = require_env("TEMPORAL_ADDRESS")
    require_port("Temporal dev server", address)
    return address


@pytest.fixture
async def temporal_client(temporal_address: str) -> AsyncIterator[Client]:
    client = await Client.connect(
        temporal_address,
        namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    yield client


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = require_env("REDIS_URL")
    hostport = url.split("//", 1)[1].split("/", 1)[0]
    require_port("Redis", hostport)
    return url


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    path = require_env("KUBECONFIG")
    if not Path(path).is_file():
        pytest.fail(f"KUBECONFIG {path} does not exist: start the control plane with `make up`")
    return path


@pytest.fixture(scope="session")
def tf_bin() -> str:
    path = require_env("STACKFLOW_TF_BIN")
    if not os.access(path, os.X_OK):
        pytest.fail(f"STACKFLOW_TF_BIN {path} is not an executable: run `make setup`")
    return path


class WorkerProcess:
    """A real `python worker.py` process on its own task queue and STACKFLOW_HOME."""

    def __init__(self, home: Path, task_queue: str, env: dict[str, str]) -> None:
        self.home = home
        self.task_queue = task_queue
        self.env = env
        self.log = home / f"worker-{task_queue}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stackflow.worker"],
            cwd=REPO,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        start_size = self.log.stat().st_size if self.log.exists() else 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"worker exited with {self.proc.returncode}; log {self.log}:\n"
                    + self.log.read_text()[-3000:]
                )
            if b"stackflow worker ready" in self.log.read_bytes()[start_size:]:
                return
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"worker not ready after {timeout}s; log {self.log}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def integration_postgres_url() -> Iterator[str]:
    """One database on the dev PostgreSQL for the integration tests (each test has its own
    project, so they never meet), dropped at the end."""
    import psycopg
    import sqlalchemy as sa

    base = require_env("STACKFLOW_POSTGRES_URL")
    name = f"sf_it_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def state_kind() -> str:
    """Which state backend a test's workers and CLI share; modules that must pass on both
    override this fixture with params (see test_operations.py)."""
    return "postgresql"


@pytest.fixture
def stack_env(
    tmp_path: Path,
    temporal_address: str,
    redis_url: str,
    state_kind: str,
    request: pytest.FixtureRequest,
) -> dict[str, str]:
    """Environment for one test: its own home and task queue, the real services, and the
    state backend (SQLite in the home, or the shared PostgreSQL database)."""
    env = dict(os.environ)
    env["STACKFLOW_HOME"] = str(tmp_path / "home")
    if state_kind == "sqlite":
        env["STACKFLOW_STATE_URL"] = f"sqlite:///{tmp_path / 'home' / 'state.db'}"
    else:
        env["STACKFLOW_STATE_URL"] = request.getfixturevalue("integration_postgres_url")
    env["STACKFLOW_TASK_QUEUE"] = f"test-{uuid.uuid4().hex[:10]}"
    env["TEMPORAL_ADDRESS"] = temporal_address
    env["REDIS_URL"] = redis_url
    env["PYTHONPATH"] = str(REPO)
    # the worker policy confines OnPrem files: the tests write theirs under tmp_path
    env.setdefault("STACKFLOW_ONPREM_ROOTS", tempfile.gettempdir())
    return env


@pytest.fixture
def worker_process(tmp_path: Path, stack_env: dict[str, str]) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(tmp_path, stack_env["STACKFLOW_TASK_QUEUE"], stack_env)
    worker.start()
    yield worker
    worker.stop()


def run_cli(
    env: dict[str, str], *args: str, input: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user runs it."""
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "stackflow"), *args],
        env=env,
        cwd=REPO,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def api(kubeconfig: str) -> Iterator[k8s.ApiClient]:
    """A Kubernetes API client of the dev cluster (the tests' own reads and edits)."""
    from tests.integration.kubehelp import api_client  # kubehelp imports this module

    client = api_client(kubeconfig)
    yield client
    client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def rt(kubeconfig: str) -> AsyncIterator[KubernetesRuntime]:
    """The Kubernetes runtime, as a worker holds it."""
    runtime = KubernetesRuntime()
    yield runtime
    await runtime.close()
