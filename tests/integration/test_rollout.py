"""Rollouts that never break runs in flight (issue 24): with Worker Versioning a run is
PINNED to the build it started on — one waiting for approval when build B becomes current
still finishes on build A, and the next run starts on B; SIGTERM drains a worker: what it
runs finishes, nothing that finished runs again, another worker takes the rest."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import (
    OperationInput,
    OperationResult,
    StatusView,
    workflow_id_for,
)
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import expect_exit, file_resource, new_project, write_spec

pytestmark = pytest.mark.integration


async def _make_current(client: Client, deployment: str, build: str) -> None:
    """Make ``build`` the deployment's current version (once its worker has polled)."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace, deployment_name=deployment, build_id=build
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _build_of(client: Client, workflow_id: str) -> str:
    described = await client.get_workflow_handle(workflow_id).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    return str(info.deployment_version.build_id)


async def _phase(client: Client, workflow_id: str, wanted: str) -> None:
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status = await handle.query("status", result_type=StatusView)
            if status.phase == wanted:
                return
        except Exception:
            pass
        await asyncio.sleep(0.3)
    raise AssertionError(f"{workflow_id} never reached {wanted}")


async def test_a_run_waiting_for_approval_finishes_on_its_build(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    deployment = f"sf{uuid.uuid4().hex[:8]}"
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    workers = {}
    for build in ("a", "b"):
        home = tmp_path / f"build-{build}"
        home.mkdir()
        env = {
            **stack_env,
            "STACKFLOW_HOME": str(home),
            "STACKFLOW_WORKER_DEPLOYMENT": deployment,
            "STACKFLOW_WORKER_BUILD_ID": build,
        }
        workers[build] = WorkerProcess(home, queue, env)
    try:
        workers["a"].start()
        assert f"build {deployment}.a" in workers["a"].log.read_text()
        await _make_current(temporal_client, deployment, "a")
        project = new_project()
        spec = {"resources": [file_resource(tmp_path / "site" / "one.conf", "one\n")]}
        workflow_id = workflow_id_for(StackRef(project, "default"))
        await temporal_client.start_workflow(
            "ApplyWorkflow",
            OperationInput(project=project, spec=spec, operator="alice"),
            id=workflow_id,
            task_queue=queue,
        )
        await _phase(temporal_client, workflow_id, "awaitingApproval")

        # build b rolls out and becomes current while the run waits for a person
        workers["b"].start()
        await _make_current(temporal_client, deployment, "b")
        approved = await asyncio.to_thread(run_cli, stack_env, "approve", "-p", project)
        expect_exit(approved)
        result = await temporal_client.get_workflow_handle(
            workflow_id, result_type=OperationResult
        ).result()
        assert result.phase == "succeeded"
        assert (tmp_path / "site" / "one.conf").read_text() == "one\n"
        assert await _build_of(temporal_client, workflow_id) == "a"

        # the next run of the stack starts on the current build
        spec_file = write_spec(
            tmp_path / "two.yaml", [file_resource(tmp_path / "site" / "one.conf", "two\n")]
        )
        applied = await asyncio.to_thread(
            run_cli, stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes", "-o", "json"
        )
        assert json.loads(expect_exit(applied).stdout)["phase"] == "succeeded"
        assert await _build_of(temporal_client, workflow_id) == "b"
    finally:
        for worker in workers.values():
            worker.stop()


async def test_sigterm_drains_a_worker_and_another_finishes_the_walk(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    first, second = (
        WorkerProcess(tmp_path / name, queue, {**stack_env, "STACKFLOW_HOME": str(tmp_path / name)})
        for name in ("w1", "w2")
    )
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    project = new_project()
    root = tmp_path / "files"
    files = [file_resource(root / f"f{i:03d}", f"{i}\n") for i in range(150)]
    spec = write_spec(tmp_path / "spec.yaml", files)
    first.start()
    # --watch: one activity per node (no groups), two at a time: a walk that takes a while
    cmd = [
        str(REPO / ".venv" / "bin" / "stackflow"), "apply", "-f", str(spec), "-p", project,
        "--yes", "--watch", "--max-concurrency", "2", "-o", "json",
    ]  # fmt: skip
    apply = subprocess.Popen(
        cmd, env=stack_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        handle = temporal_client.get_workflow_handle(workflow_id_for(StackRef(project, "default")))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if (await handle.query("status", result_type=StatusView)).done >= 30:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        assert first.proc is not None
        stopping = time.monotonic()
        first.proc.terminate()  # SIGTERM
        await asyncio.to_thread(first.proc.wait, 30)
        drained = time.monotonic() - stopping
        assert drained < 15, f"the worker took {drained:.1f}s to stop"
        assert "stopping (SIGTERM)" in first.log.read_text()
        second.start()
        out, err = await asyncio.to_thread(apply.communicate, timeout=180)
    finally:
        apply.kill()
        second.stop()
    assert apply.returncode == 0, err
    assert json.loads(out)["phase"] == "succeeded"
    assert all((root / f"f{i:03d}").read_text() == f"{i}\n" for i in range(150))
    # nothing that had finished ran again: every activity started once, none failed
    history = await handle.fetch_history()
    started = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    assert started and all(e.activity_task_started_event_attributes.attempt == 1 for e in started)
    failed = [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]
    assert failed == []
