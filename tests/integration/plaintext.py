"""What ``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1`` must do, checked the same way against the
dev server (test_require_encrypted.py) and the mTLS server (test_temporal_tls.py): a run
started by `temporal workflow start` with plain JSON fails at once with one line (no failed
workflow task, nothing applied, no release), a plain approval is rejected, and the same start
through the codec server (``--codec-endpoint``) runs and is approved."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from stackflow.temporal.operation import ApprovalInput, OperationResult
from tests.integration.conftest import REPO
from tests.integration.opshelp import all_releases, file_resource, new_project, wait_phase

FAIL_WITHIN = 15.0
"""Seconds a refused run may take to end (a failed workflow task would be retried for good)."""
REFUSED = (
    "invalid input: argument 1 is not encrypted, and this worker refuses unencrypted input "
    "(STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1)"
)


def temporal_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The `temporal` CLI, configured by the environment (TEMPORAL_ADDRESS, TEMPORAL_TLS_*)."""
    temporal = shutil.which("temporal", path=env.get("PATH"))
    assert temporal, 'the Temporal CLI is not on PATH: eval "$(scripts/services.sh env)"'
    return subprocess.run(
        [temporal, "--address", env["TEMPORAL_ADDRESS"], *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )


def start_apply(
    env: dict[str, str], project: str, target: Path, *codec: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`temporal workflow start` of an apply, its input written as plain JSON (encoded by the
    codec server when ``codec`` names it); the run's workflow id and the CLI's result."""
    request = {
        "project": project,
        "workspace": "dev",
        "spec": {"resources": [file_resource(target, "started by temporal\n")]},
    }
    wid = f"stackflow/{project}/dev"
    started = temporal_cli(
        env,
        "workflow",
        "start",
        "--task-queue",
        env["STACKFLOW_TASK_QUEUE"],
        "--type",
        "ApplyWorkflow",
        "--workflow-id",
        wid,
        "--input",
        json.dumps(request),
        *codec,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    return wid, started


async def approve_and_finish(client: Client, wid: str) -> OperationResult:
    """Wait for the approval, approve as ann (stackflow's client: encrypted), and the result."""
    handle = client.get_workflow_handle(wid, result_type=OperationResult)
    await wait_phase(handle, "awaitingApproval")
    assert await handle.execute_update("approve", ApprovalInput(by="ann")) == "approved by ann"
    return await asyncio.wait_for(handle.result(), 120)


async def assert_plain_refused_and_codec_runs(
    env: dict[str, str],
    client: Client,
    plain_client: Client,
    codec: list[str],
    tmp_path: Path,
) -> None:
    """``env``: a strict worker's; ``client``: stackflow's (encrypting); ``plain_client``: the
    SDK's default converter; ``codec``: the `--codec-endpoint …` options."""
    project = new_project()
    target = tmp_path / f"{project}.conf"
    began = time.monotonic()
    wid, _ = start_apply(env, project, target)
    handle = client.get_workflow_handle(wid)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), FAIL_WITHIN)
    assert time.monotonic() - began < FAIL_WITHIN
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput", cause
    assert cause.message.startswith(REFUSED) and "--codec-endpoint" in cause.message
    assert "\n" not in cause.message
    events = [e.event_type async for e in handle.fetch_history_events()]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events
    assert not target.exists() and all_releases(env, project, "dev") == []

    # the same start through the codec server: encrypted, it runs
    wid, _ = start_apply(env, project, target, *codec)
    await wait_phase(client.get_workflow_handle(wid), "awaitingApproval")
    # an approval in plain JSON (any name, from anyone who reaches Temporal) is rejected
    with pytest.raises(WorkflowUpdateFailedError) as rejected:
        await plain_client.get_workflow_handle(wid).execute_update("approve", {"by": "mallory"})
    assert isinstance(rejected.value.cause, ApplicationError)
    assert rejected.value.cause.message.startswith("invalid input: argument 1 is not encrypted")
    result = await approve_and_finish(client, wid)
    assert result.phase == "succeeded" and target.read_text() == "started by temporal\n"
    [release] = all_releases(env, project, "dev")
    assert release.approval is not None and release.approval.by == "ann"
