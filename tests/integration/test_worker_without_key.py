"""A worker started without the encryption key, given an encrypted run: it cannot read the
run's input, and its log says why in one line (the key id, the variables to set), without
any key material or payload content."""

from __future__ import annotations

import base64
from pathlib import Path

from temporalio.client import Client

from stackflow.core.crypto import KeyRing
from stackflow.core.refs import StackRef
from stackflow.temporal.operation import OperationInput, workflow_id_for
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import file_resource, new_project, poll, write_spec

LINE = "but this process has no encryption key"


async def test_a_worker_without_the_key_says_so_once(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    ring = KeyRing.from_env()
    assert ring is not None, "the dev loop encrypts payloads (make env sets the key file)"
    env = {
        k: v
        for k, v in stack_env.items()
        if k not in {"STACKFLOW_ENCRYPTION_KEY", "STACKFLOW_ENCRYPTION_KEY_FILE"}
    }
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    project = new_project()
    secret_content = f"content-{project}\n"
    handle = None
    try:
        assert "payloads NOT encrypted" in worker.log.read_text()
        handle = await temporal_client.start_workflow(
            "ApplyWorkflow",
            OperationInput(
                project=project,
                spec={"resources": [file_resource(tmp_path / "f", secret_content)]},
                auto_approve=True,
            ),
            id=workflow_id_for(StackRef(project, "default")),
            task_queue=env["STACKFLOW_TASK_QUEUE"],
        )

        async def logged() -> str | None:
            text = worker.log.read_text()
            return text if LINE in text else None

        text = await poll(logged, timeout=60, what="the worker's no-key line")
        [line] = [line for line in text.splitlines() if LINE in line]
        assert f"key {ring.current!r}" in line
        assert "STACKFLOW_ENCRYPTION_KEY" in line and "ERROR stackflow.temporal.codec" in line
        log = worker.log.read_text()
        for key in ring.keys.values():
            assert base64.b64encode(key).decode() not in log
        assert secret_content.strip() not in log
        assert not (tmp_path / "f").exists(), "the run must not have done anything"
    finally:
        if handle is not None:
            await handle.terminate("test: worker without the key")
        worker.stop()


def test_a_cli_without_the_key_says_so_in_one_line(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    """`stackflow apply` in direct mode without the key, against a worker that has it: the
    worker's answers (the status query) are encrypted, and the CLI cannot read them. One
    `Error:` line naming the key id and the variables, exit 2 (it was the SDK's KeyError
    traceback, 'Unknown payload encoding binary/encrypted')."""
    ring = KeyRing.from_env()
    assert ring is not None, "the dev loop encrypts payloads (make env sets the key file)"
    env = {
        k: v
        for k, v in stack_env.items()
        if k not in {"STACKFLOW_ENCRYPTION_KEY", "STACKFLOW_ENCRYPTION_KEY_FILE"}
    }
    project = new_project()
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(tmp_path / "f", "x\n")])
    proc = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("Error: a Temporal payload is encrypted with key "), line
    assert f"{ring.current!r}" in line and "STACKFLOW_ENCRYPTION_KEY" in line
    for key in ring.keys.values():
        assert base64.b64encode(key).decode() not in proc.stdout + proc.stderr
