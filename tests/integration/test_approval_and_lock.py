"""Approval by workflow Update (approve, reject, timeout, validator) and the stack lock."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError

from stackflow.temporal.operation import ApprovalInput, OperationInput
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    file_resource,
    new_project,
    start_run,
    wait_phase,
    write_spec,
)


def _spec(root: Path, count: int) -> dict[str, Any]:
    return {"resources": [file_resource(root / f"f{i:03d}.txt", f"{i}\n") for i in range(count)]}


async def test_approve_by_update_records_who_approved_and_validator_refuses_later_approvals(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    request = OperationInput(project=project, spec=_spec(root, 40), max_concurrency=1)
    handle = await start_run(temporal_client, stack_env, request)

    status = await wait_phase(handle, "awaitingApproval")
    assert status.changes["summary"]["Create"] == 40 and status.total == 40
    assert not root.exists()  # nothing happens before approval
    [release] = all_releases(stack_env, project)
    assert release.phase == "previewing"  # the lock is held while waiting

    answer = await handle.execute_update("approve", ApprovalInput(by="alice", reason="lgtm"))
    assert answer == "approved by alice"

    # While it applies (one file at a time), a second approval is refused by the validator.
    await wait_phase(handle, "applying")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("approve", ApprovalInput(by="mallory"))
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "NotAwaitingApproval"
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("reject", ApprovalInput(by="mallory"))

    result = await handle.result()
    assert result.phase == "succeeded"
    assert len(result.results) == 40
    assert sorted(p.name for p in root.iterdir()) == [f"f{i:03d}.txt" for i in range(40)]
    [release] = all_releases(stack_env, project)
    assert release.phase == "succeeded"
    assert release.approval is not None
    assert release.approval.decision == "approved"
    assert release.approval.by == "alice" and release.approval.reason == "lgtm"
    # the refused updates left no trace: the history still replays
    assert await assert_histories_replay(temporal_client, project, at_least=1) == 1


async def test_reject_and_approval_timeout_fail_the_release_with_nothing_applied(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"

    # reject
    handle = await start_run(
        temporal_client, stack_env, OperationInput(project=project, spec=_spec(root, 3))
    )
    await wait_phase(handle, "awaitingApproval")
    assert await handle.execute_update("reject", ApprovalInput(by="bob", reason="not today")) == (
        "rejected by bob"
    )
    result = await handle.result()
    assert result.phase == "failed" and result.results == []
    assert result.error == "apply rejected by bob: not today"
    assert not root.exists()
    [rejected] = all_releases(stack_env, project)
    assert rejected.phase == "failed" and rejected.state.resources == []
    assert rejected.approval is not None
    assert (rejected.approval.decision, rejected.approval.by) == ("rejected", "bob")

    # the approval timeout: nobody answers within 2 s
    handle = await start_run(
        temporal_client,
        stack_env,
        OperationInput(project=project, spec=_spec(root, 3), approval_timeout_seconds=2),
    )
    result = await handle.result()
    assert result.phase == "failed" and result.results == []
    assert result.error is not None and "timeout" in result.error
    assert not root.exists()
    timed_out = all_releases(stack_env, project)[-1]
    assert timed_out.revision == 2 and timed_out.phase == "failed"
    assert timed_out.approval is not None and timed_out.approval.by == "timeout"
    assert timed_out.state.resources == []

    # approving a run that is over is refused (it is not awaiting approval any more)
    with pytest.raises(Exception):  # noqa: B017 - an update on a closed run fails (RPC error)
        await handle.execute_update("approve", ApprovalInput(by="late"))

    assert await assert_histories_replay(temporal_client, project, at_least=2) == 2


async def test_concurrent_apply_is_refused_and_the_release_lock_holds_across_workflow_ids(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    handle = await start_run(
        temporal_client, stack_env, OperationInput(project=project, spec=_spec(root, 2))
    )
    await wait_phase(handle, "awaitingApproval")

    # The CLI on the same stack: refused at start (same workflow id), exit code 3.
    spec = write_spec(tmp_path / "spec.yaml", _spec(root, 2)["resources"])
    second = run_cli(stack_env, "apply", "-f", str(spec), "--project", project, "--yes")
    assert second.returncode == 3, second.stdout + second.stderr
    assert "already has an operation running" in second.stderr

    # A run under another workflow id gets past Temporal but not the release lock.
    other = await start_run(
        temporal_client,
        stack_env,
        OperationInput(project=project, spec=_spec(root, 2), auto_approve=True),
        workflow_id=f"stackflow/{project}/default/other-{uuid.uuid4().hex[:6]}",
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await other.result()
    cause: BaseException | None = failed.value
    while cause is not None and not (isinstance(cause, ApplicationError) and cause.type):
        cause = cause.__cause__
    assert isinstance(cause, ApplicationError) and cause.type == "StackLocked", failed.value
    assert "is locked" in cause.message
    [release] = all_releases(stack_env, project)  # no second release was written
    assert release.revision == 1 and release.phase == "previewing"

    # While the holding run is open, `release unlock` refuses (exit 3) and names it.
    refused = run_cli(stack_env, "release", "unlock", "--project", project)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "still running" in refused.stderr and handle.id in refused.stderr

    # Terminate the holder: Temporal knows it is gone, so the next apply recovers the stack
    # by itself (no unlock) and the closed release says why.
    await handle.terminate("test: the holder goes away without releasing")
    done = run_cli(stack_env, "apply", "-f", str(spec), "--project", project, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = all_releases(stack_env, project)
    assert (first.phase, second.phase) == ("failed", "succeeded")
    assert "was terminated" in (first.error or "") and "recovered" in (first.error or "")
    assert (root / "f001.txt").read_text() == "1\n"


async def test_four_eyes_refuses_the_requesters_own_approval_for_every_client(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    """A worker policy (``STACKFLOW_FOUR_EYES``, project globs) makes the run's approve
    validator refuse the requester: whatever client sends the Update, the run waits for
    another approver; other projects are not affected."""
    project = new_project()
    env = {**stack_env, "STACKFLOW_FOUR_EYES": f"nomatch-*,{project[:4]}*"}
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        root = tmp_path / "files"
        request = OperationInput(project=project, spec=_spec(root, 3), operator="alice")
        handle = await start_run(temporal_client, env, request)
        await wait_phase(handle, "awaitingApproval")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("approve", ApprovalInput(by="alice"))
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "FourEyes"
        assert "alice started this run and may not approve it" in str(cause)
        assert not root.exists()
        assert await handle.execute_update("approve", ApprovalInput(by="bob")) == "approved by bob"
        result = await handle.result()
        assert result.phase == "succeeded"
        [release] = all_releases(env, project)
        assert release.approval is not None and release.approval.by == "bob"

        # a project the policy does not name: the requester may approve their own run
        other = f"x{new_project()}"
        mine = OperationInput(project=other, spec=_spec(tmp_path / "other", 1), operator="alice")
        handle = await start_run(temporal_client, env, mine)
        await wait_phase(handle, "awaitingApproval")
        assert await handle.execute_update("approve", ApprovalInput(by="alice")) == (
            "approved by alice"
        )
        assert (await handle.result()).phase == "succeeded"
    finally:
        worker.stop()
