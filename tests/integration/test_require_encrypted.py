"""``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1`` on the dev services: a worker with it fails a
run started by `temporal workflow start` with plain JSON at once, with one line, and rejects a
plain approval; the same start through the dev codec server (``--codec-endpoint``) runs, and so
does stackflow's own CLI. With the setting off (every other test's worker, and
test_operations.py's `temporal workflow start`), plain JSON input runs as always. The same
checks over mTLS are test_temporal_tls.py's (`make test-server`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.integration.conftest import WorkerProcess, require_env, run_cli
from tests.integration.opshelp import cli_json, file_resource, new_project, write_spec
from tests.integration.plaintext import assert_plain_refused_and_codec_runs

pytestmark = pytest.mark.integration


@pytest.fixture
def strict_worker(tmp_path: Path, stack_env: dict[str, str]) -> Iterator[WorkerProcess]:
    env = {**stack_env, "STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS": "1"}
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    yield worker
    worker.stop()


async def test_plain_json_fails_and_the_codec_endpoint_runs(
    tmp_path: Path,
    strict_worker: WorkerProcess,
    temporal_client: Client,
    temporal_address: str,
) -> None:
    env = strict_worker.env
    assert "payloads encrypted, unencrypted input refused" in strict_worker.log.read_text()
    codec = ["--codec-endpoint", require_env("STACKFLOW_CODEC_ENDPOINT")]
    if env.get("STACKFLOW_CODEC_TOKEN"):
        codec += ["--codec-auth", f"Bearer {env['STACKFLOW_CODEC_TOKEN']}"]
    plain = await Client.connect(
        temporal_address, namespace=os.environ.get("TEMPORAL_NAMESPACE", "default")
    )
    await assert_plain_refused_and_codec_runs(env, temporal_client, plain, codec, tmp_path)

    # stackflow's CLI encrypts: it runs as always on a strict worker
    target = tmp_path / "cli.conf"
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(target, "strict\n")])
    applied = run_cli(
        env, "apply", "-f", str(spec), "--yes", "--project", new_project(), "--output", "json"
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cli_json(applied)["phase"] == "succeeded" and target.read_text() == "strict\n"
