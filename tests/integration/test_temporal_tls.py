"""An authenticated, encrypted Temporal connection, against the Temporal server proper with
mTLS required (`make test-server`).

The test starts a server of its own (the `temporal-server` binary `scripts/setup.sh
temporal-server` builds, on free ports, in-memory SQLite, stopped at the end: the shared
`temporal` service is left alone) whose frontend and internode listeners require a client
certificate of a CA the test makes, and registers the `default` namespace with stackflow's
search attributes over mTLS. Then, with the Temporal CLI's own variables
(``TEMPORAL_TLS_CLIENT_CERT_PATH`` …) and nothing else:

- a worker, the CLI in direct mode, `stackflow serve` and the `temporal` CLI connect and a run
  succeeds through each;
- a client without a certificate, or with one of another CA, is refused: the CLI and the
  worker end at once with one line and a non-zero exit (never an outage waited out);
- a worker with ``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1`` fails a run started by `temporal
  workflow start` with plain JSON at once with one line (no failed workflow task, nothing
  applied) and rejects a plain approval, while the same start through the codec server
  (``--codec-endpoint``) runs; with the setting off, plain JSON input still runs.

Skipped unless STACKFLOW_TEMPORAL_MODE=server (set by `make test-server`, which builds the
server)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from stackflow.core.crypto import KeyRing, new_key_line
from stackflow.temporal.codec import data_converter
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, file_resource, new_project, write_spec
from tests.integration.plaintext import (
    approve_and_finish,
    assert_plain_refused_and_codec_runs,
    start_apply,
    temporal_cli,
)
from tests.tlscerts import Pki, make_pki

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("STACKFLOW_TEMPORAL_MODE", "dev") != "server",
        reason="needs the Temporal server proper (TLS listeners): `make test-server` "
        "(STACKFLOW_TEMPORAL_MODE=server); the dev server has no TLS",
    ),
]

NAMESPACE = "default"
SEARCH_ATTRIBUTES = {
    "StackflowProject": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "StackflowWorkspace": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "StackflowPhase": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "StackflowDrift": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
}
KEY_LINE = new_key_line("tls1")
KEYS = KeyRing.parse(KEY_LINE, "test")
CODEC_TOKEN = uuid.uuid4().hex
API_TOKEN = uuid.uuid4().hex
REFUSED_WITHIN = 30.0
"""Seconds a refused client may take to end (an outage would be waited out for minutes)."""
FAIL_WITHIN = 15.0
TLS_VARS = ("TEMPORAL_TLS", "TEMPORAL_API_KEY")


def server_binary() -> Path:
    out = subprocess.run(
        ["bash", "-c", 'source scripts/lib.sh && echo "$TEMPORAL_SERVER_BIN_DIR"'],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.strip()
    binary = Path(out) / "temporal-server"
    if not binary.is_file():
        pytest.fail(
            f"{binary} is missing: run `scripts/setup.sh temporal-server` (`make test-server` "
            "builds it)",
            pytrace=False,
        )
    return binary


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_base() -> int:
    """A frontend port P with P..P+10 and the membership ports P-300..P-294 free."""
    for _ in range(200):
        base = random.randrange(30_000, 45_000, 20)
        wanted = [base + i for i in (0, 1, 2, 6, 10)] + [base - 300 + i for i in (0, 1, 2, 6)]
        if all(port_free(p) for p in wanted):
            return base
    raise AssertionError("no free port range for the TLS Temporal server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_config(base: int, pki: Pki) -> dict[str, Any]:
    sqlite = {
        "pluginName": "sqlite",
        "databaseName": "default",
        "connectAddr": "localhost",
        "connectProtocol": "tcp",
        "connectAttributes": {"mode": "memory", "cache": "private"},
        "maxConns": 1,
        "maxIdleConns": 1,
        "maxConnLifetime": "1h",
    }
    server_side = {
        "certFile": str(pki.server.cert),
        "keyFile": str(pki.server.key),
        "requireClientAuth": True,
        "clientCaFiles": [str(pki.ca)],
    }
    client_side = {"serverName": "localhost", "rootCaFiles": [str(pki.ca)]}
    services = {}
    for name, offset in (("frontend", 0), ("history", 1), ("matching", 2), ("worker", 6)):
        rpc: dict[str, Any] = {
            "grpcPort": base + offset,
            "membershipPort": base + offset - 300,
            "bindOnLocalHost": True,
        }
        if name == "frontend":
            rpc["httpPort"] = base + 10
        services[name] = {"rpc": rpc}
    return {
        "log": {"stdout": True, "level": "warn"},
        "persistence": {
            "defaultStore": "sqlite-default",
            "visibilityStore": "sqlite-visibility",
            "numHistoryShards": 1,
            "datastores": {
                "sqlite-default": {"sql": sqlite},
                "sqlite-visibility": {"sql": sqlite},
            },
        },
        "global": {
            "membership": {"maxJoinDuration": "30s", "broadcastAddress": "127.0.0.1"},
            "tls": {
                "internode": {"server": server_side, "client": client_side},
                "frontend": {"server": server_side, "client": client_side},
                "systemWorker": {
                    "certFile": str(pki.server.cert),
                    "keyFile": str(pki.server.key),
                    "client": client_side,
                },
            },
        },
        "services": services,
        "clusterMetadata": {
            "enableGlobalNamespace": False,
            "failoverVersionIncrement": 10,
            "masterClusterName": "active",
            "currentClusterName": "active",
            "clusterInformation": {
                "active": {
                    "enabled": True,
                    "initialFailoverVersion": 1,
                    "rpcName": "frontend",
                    "rpcAddress": f"127.0.0.1:{base}",
                }
            },
        },
        "dcRedirectionPolicy": {"policy": "noop"},
        "dynamicConfigClient": {
            "filepath": str(REPO / "deploy" / "temporal" / "dynamicconfig" / "stackflow.yaml"),
            "pollInterval": "10s",
        },
    }


@dataclass
class TlsTemporal:
    address: str
    pki: Pki
    rogue: Pki
    home: Path
    env: dict[str, str] = field(default_factory=dict)
    """The environment every stackflow process of these tests gets: this server, mTLS with
    the Temporal CLI's variables, a state backend and a key of their own."""

    def tls(self) -> TLSConfig:
        return TLSConfig(
            server_root_ca_cert=self.pki.ca.read_bytes(),
            client_cert=self.pki.client.cert.read_bytes(),
            client_private_key=self.pki.client.key.read_bytes(),
        )

    async def client(self) -> Client:
        """A client as stackflow's own (encrypting with the tests' key), over mTLS."""
        return await Client.connect(
            self.address, namespace=NAMESPACE, tls=self.tls(), data_converter=data_converter(KEYS)
        )

    async def plain_client(self) -> Client:
        """Another service's client over mTLS: the SDK's default converter, plain JSON."""
        return await Client.connect(self.address, namespace=NAMESPACE, tls=self.tls())

    def with_env(self, **changes: str | None) -> dict[str, str]:
        env = dict(self.env)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env


async def prepare(server: TlsTemporal, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for the frontend (over mTLS), then register the namespace and the attributes."""
    deadline = time.monotonic() + 120
    client: Client | None = None
    while client is None:
        if proc.poll() is not None:
            pytest.fail(f"temporal-server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            client = await Client.connect(server.address, namespace=NAMESPACE, tls=server.tls())
        except RuntimeError:
            if time.monotonic() > deadline:
                pytest.fail(f"temporal-server not serving in 120s:\n{log.read_text()[-3000:]}")
            await asyncio.sleep(0.5)
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=NAMESPACE, workflow_execution_retention_period=Duration(seconds=86_400)
        )
    )
    while True:  # the frontend's namespace cache takes a few seconds to know it
        try:
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=NAMESPACE)
            )
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=NAMESPACE, search_attributes=SEARCH_ATTRIBUTES)
            )
            break
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    # a workflow list that filters on them answers once they are known
    while True:
        try:
            async for _ in client.list_workflows('StackflowProject = "none"'):
                pass
            return
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.fixture(scope="module")
def tls_temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsTemporal]:
    binary = server_binary()
    root = tmp_path_factory.mktemp("tls-temporal")
    pki, rogue = make_pki(root / "pki"), make_pki(root / "rogue", prefix="rogue-")
    base = free_base()
    config_dir = root / "config"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text(yaml.safe_dump(server_config(base, pki)))
    log = root / "temporal-server.log"
    config = str(config_dir / "config.yaml")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(binary), "--config-file", config, "--allow-no-auth", "start"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,
        )
    server = TlsTemporal(f"127.0.0.1:{base}", pki, rogue, root / "home")
    try:
        asyncio.run(prepare(server, proc, log))
        env = {k: v for k, v in os.environ.items() if not k.startswith(TLS_VARS)}
        env.pop("STACKFLOW_ENCRYPTION_KEY_FILE", None)
        env.pop("REDIS_URL", None)
        server.home.mkdir()
        env.update(
            TEMPORAL_ADDRESS=server.address,
            TEMPORAL_NAMESPACE=NAMESPACE,
            TEMPORAL_TLS_CLIENT_CERT_PATH=str(pki.client.cert),
            TEMPORAL_TLS_CLIENT_KEY_PATH=str(pki.client.key),
            TEMPORAL_TLS_SERVER_CA_CERT_PATH=str(pki.ca),
            STACKFLOW_ENCRYPTION_KEY=KEY_LINE,
            STACKFLOW_HOME=str(server.home),
            STACKFLOW_STATE_URL=f"sqlite:///{server.home / 'state.db'}",
            STACKFLOW_TASK_QUEUE=f"tls-{uuid.uuid4().hex[:8]}",
            STACKFLOW_ONPREM_ROOTS=tempfile.gettempdir(),
            PYTHONPATH=str(REPO),
        )
        server.env = env
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_worker(server: TlsTemporal, name: str, **changes: str | None) -> WorkerProcess:
    home = server.home.parent / name
    home.mkdir(exist_ok=True)
    env = server.with_env(**changes)
    worker = WorkerProcess(home, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start(timeout=90)
    return worker


@pytest.fixture(scope="module")
def worker(tls_temporal: TlsTemporal) -> Iterator[WorkerProcess]:
    """The lax worker: encrypted payloads, plain JSON input still accepted (the default)."""
    process = start_worker(tls_temporal, "worker-lax")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def strict(tls_temporal: TlsTemporal) -> Iterator[WorkerProcess]:
    """A worker that refuses unencrypted input, on a task queue of its own."""
    process = start_worker(
        tls_temporal,
        "worker-strict",
        STACKFLOW_TASK_QUEUE=f"tls-strict-{uuid.uuid4().hex[:8]}",
        STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS="1",
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def codec_endpoint(tls_temporal: TlsTemporal) -> Iterator[str]:
    """`stackflow codec-server` with the tests' key and a token, on a free port."""
    port = free_port()
    log = tls_temporal.home.parent / "codec.log"
    env = tls_temporal.with_env(STACKFLOW_CODEC_TOKEN=CODEC_TOKEN)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stackflow.cli.main", "codec-server", "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@contextlib.contextmanager
def serving(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[httpx.Client, Path]]:
    """`stackflow serve` with ``env`` on a free port, answering HTTP (ready or not), with an
    approver's token; its client and log."""
    port = free_port()
    tokens = tmp_path / f"tokens-{port}.json"
    digest = hashlib.sha256(API_TOKEN.encode()).hexdigest()
    tokens.write_text(json.dumps([{"name": "ann", "sha256": digest, "roles": {"*": "approver"}}]))
    log = tmp_path / f"api-{port}.log"
    with log.open("ab") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "stackflow.cli.main", "serve", "--port", str(port)],
            env={**env, "STACKFLOW_API_TOKENS": str(tokens)},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=headers) as http:
            deadline = time.monotonic() + 60
            while True:
                assert api.poll() is None, log.read_text()
                try:
                    http.get("/v1/healthz")
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            yield http, log
    finally:
        api.terminate()
        api.wait(timeout=20)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


async def test_worker_cli_api_and_temporal_cli_run_over_mtls(
    tls_temporal: TlsTemporal, worker: WorkerProcess, tmp_path: Path
) -> None:
    env = tls_temporal.env
    ready = worker.log.read_text()
    assert f"on {tls_temporal.address}" in ready and "Temporal over mTLS (client certificate)" in (
        ready
    ), ready

    # the CLI, direct mode
    project = new_project()
    target = tmp_path / "cli.conf"
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(target, "from the CLI\n")])
    applied = run_cli(
        env, "apply", "-f", str(spec), "--yes", "--project", project, "--output", "json"
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cli_json(applied)["phase"] == "succeeded"
    assert target.read_text() == "from the CLI\n"

    # the API: ready (it reached Temporal), and a run through it
    with serving(env, tmp_path) as (http, log):
        assert http.get("/v1/readyz").status_code == 200
        assert "over mTLS (client certificate)" in log.read_text()
        api_project = new_project()
        api_target = tmp_path / "api.conf"
        r = http.post(
            f"/v1/stacks/{api_project}/dev/runs",
            json={
                "operation": "apply",
                "spec": {"resources": [file_resource(api_target, "from the API\n")]},
            },
        )
        assert r.status_code == 201, r.text
        wid = r.json()["workflow_id"]
        result = await approve_and_finish(await tls_temporal.client(), wid)
        assert result.phase == "succeeded"
        assert api_target.read_text() == "from the API\n"

    # the temporal CLI reads the same variables
    listed = temporal_cli(env, "workflow", "list", "--query", f'WorkflowId = "{wid}"')
    assert listed.returncode == 0 and wid in listed.stdout, listed.stdout + listed.stderr


def one_line_refusal(proc: subprocess.CompletedProcess[str], took: float) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert took < REFUSED_WITHIN, (took, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def timed_cli(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = run_cli(env, *args, timeout=120)
    return proc, time.monotonic() - began


async def test_a_client_without_a_certificate_is_refused(
    tls_temporal: TlsTemporal, tmp_path: Path
) -> None:
    server = tls_temporal
    no_cert = server.with_env(TEMPORAL_TLS_CLIENT_CERT_PATH=None, TEMPORAL_TLS_CLIENT_KEY_PATH=None)
    rogue = server.with_env(
        TEMPORAL_TLS_CLIENT_CERT_PATH=str(server.rogue.client.cert),
        TEMPORAL_TLS_CLIENT_KEY_PATH=str(server.rogue.client.key),
    )
    status = ("status", "--project", new_project(), "--workspace", "dev")
    for name, env in (
        ("no certificate", no_cert),
        ("another CA's certificate", rogue),
        # the server is checked too: by the system's roots, or under another name
        ("no server CA", server.with_env(TEMPORAL_TLS_SERVER_CA_CERT_PATH=None)),
        ("another server name", server.with_env(TEMPORAL_TLS_SERVER_NAME="other.example")),
    ):
        proc, took = timed_cli(env, *status)
        line = one_line_refusal(proc, took)
        assert f"Temporal at {server.address} refused the TLS connection" in line, (name, line)
        assert "TEMPORAL_TLS_" in line, line
        assert proc.returncode == 1, (name, proc.returncode)

    # the worker: one line at once, not 30 attempts over minutes
    home = tmp_path / "refused-worker"
    home.mkdir()
    began = time.monotonic()
    refused = subprocess.run(
        [sys.executable, "-m", "stackflow.worker"],
        env={**no_cert, "STACKFLOW_HOME": str(home)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_line_refusal(refused, time.monotonic() - began)
    assert line.startswith(f"Error: Temporal at {server.address} refused the TLS connection (")
    # the SDK's "CertificateRequired", or the diagnosis' "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert "CERTIFICATEREQUIRED" in line.upper().replace("_", "").replace(" ", ""), line

    # the API without a certificate: not ready, and a start is a 502 naming the refusal
    with serving(no_cert, tmp_path) as (http, _):
        ready = http.get("/v1/readyz")
        assert ready.status_code == 503 and "refused the TLS connection" in ready.text, ready.text
        spec = {"resources": [file_resource(tmp_path / "never.conf", "never\n")]}
        r = http.post(
            f"/v1/stacks/{new_project()}/dev/runs", json={"operation": "apply", "spec": spec}
        )
        assert r.status_code == 502, r.text
        assert r.json()["detail"].startswith(
            f"Temporal at {server.address} refused the TLS connection"
        ), r.text

    # no TLS at all: the server closes each connection as it opens; one handshake tells
    # that it speaks TLS (a proxy with its backend down would not: that stays an outage)
    plaintext = server.with_env(
        TEMPORAL_TLS_CLIENT_CERT_PATH=None,
        TEMPORAL_TLS_CLIENT_KEY_PATH=None,
        TEMPORAL_TLS_SERVER_CA_CERT_PATH=None,
    )
    proc, took = timed_cli(plaintext, *status)
    line = one_line_refusal(proc, took)
    assert line == (
        f"Error: Temporal at {server.address} refused a plaintext connection: it speaks TLS "
        "and this client does not: set TEMPORAL_TLS=true (and TEMPORAL_TLS_CLIENT_CERT_PATH/"
        "TEMPORAL_TLS_CLIENT_KEY_PATH for mTLS, TEMPORAL_TLS_SERVER_CA_CERT_PATH for a "
        "private CA)"
    ), line

    # bad settings stop before any connection, exit 2
    proc, took = timed_cli(server.with_env(TEMPORAL_TLS_CLIENT_KEY_PATH=None), *status)
    line = one_line_refusal(proc, took)
    assert proc.returncode == 2 and "mTLS needs both" in line, line

    # the server itself refuses: the temporal CLI without a certificate fails too
    denied = temporal_cli(no_cert, "workflow", "list", "--limit", "1")
    assert denied.returncode != 0, denied.stdout

    # and an SDK client without one cannot call anything
    with pytest.raises(RuntimeError):
        client = await Client.connect(
            server.address,
            namespace=NAMESPACE,
            tls=TLSConfig(server_root_ca_cert=server.pki.ca.read_bytes()),
        )
        await client.count_workflows()


async def test_the_refuse_plaintext_setting_fails_plain_json_runs_and_codec_runs_pass(
    tls_temporal: TlsTemporal, strict: WorkerProcess, codec_endpoint: str, tmp_path: Path
) -> None:
    env = strict.env
    assert "encrypted, unencrypted input refused" in strict.log.read_text()
    codec = ["--codec-endpoint", codec_endpoint, "--codec-auth", f"Bearer {CODEC_TOKEN}"]
    client, plain = await tls_temporal.client(), await tls_temporal.plain_client()
    await assert_plain_refused_and_codec_runs(env, client, plain, codec, tmp_path)

    # stackflow's own CLI encrypts: it runs as always on the strict worker
    cli_target = tmp_path / "strict-cli.conf"
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(cli_target, "strict\n")])
    applied = run_cli(
        env, "apply", "-f", str(spec), "--yes", "--project", new_project(), "--output", "json"
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cli_target.read_text() == "strict\n"


async def test_with_the_setting_off_plain_json_input_still_runs(
    tls_temporal: TlsTemporal, worker: WorkerProcess, tmp_path: Path
) -> None:
    project = new_project()
    target = tmp_path / "lax.conf"
    wid, _ = start_apply(worker.env, project, target)
    result = await approve_and_finish(await tls_temporal.client(), wid)
    assert result.phase == "succeeded" and target.read_text() == "started by temporal\n"
