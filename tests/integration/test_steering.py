"""An operator steers runs after the CLI is gone: pause on failed nodes then retry or abort,
approve/reject races, an error in workflow code, fail_fast across the delete walk, and
deletion order along $kusion_path edges."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import (
    ApprovalInput,
    OperationInput,
    OperationPlan,
    OperationResult,
    workflow_id_for,
)
from stackflow.workflows.apply import ApplyWorkflow
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    cli_json,
    file_resource,
    local_worker,
    new_project,
    scheduled_ids,
    start_run,
    wait_phase,
    write_spec,
)


def blocked_spec(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Two good files and one under a path that is a file (fails until it is removed)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must go\n")
    spec = {
        "resources": [
            file_resource(tmp_path / "ok1", "1\n"),
            file_resource(blocker / "x", "x\n"),
            file_resource(tmp_path / "ok2", "2\n"),
        ]
    }
    return spec, blocker


async def test_paused_run_retries_the_failed_node_after_the_fix(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    spec, blocker = blocked_spec(tmp_path)
    spec_file = write_spec(tmp_path / "spec.yaml", spec["resources"])
    cli = run_cli(
        stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes", "--on-failure", "pause"
    )
    assert cli.returncode == 4, cli.stdout + cli.stderr  # paused, the run waits
    assert f"stackflow retry -p {project}" in cli.stderr

    handle = temporal_client.get_workflow_handle(
        workflow_id_for(StackRef(project, "default")), result_type=OperationResult
    )
    status = await wait_phase(handle, "awaitingDecision")
    assert status.failed == 1
    shown = await current_details(handle)
    assert "awaitingDecision" in shown and "stackflow retry" in shown and "blocker" in shown

    blocker.unlink()
    out = run_cli(stack_env, "retry", "-p", project)
    assert out.returncode == 0 and "retry requested" in out.stdout, out.stderr
    result = await handle.result()
    assert result.phase == "succeeded", result.error
    assert result.counts == {"succeeded": 3}
    assert (blocker / "x").read_text() == "x\n"
    [release] = all_releases(stack_env, project)
    assert release.phase == "succeeded" and len(release.state.resources) == 3
    # a second retry is refused: the run is no longer paused (it is over)
    again = run_cli(stack_env, "retry", "-p", project)
    assert again.returncode == 1 and "no running operation" in again.stderr
    assert await assert_histories_replay(temporal_client, project, at_least=1) == 1


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    from temporalio.api.sdk.v1 import WorkflowMetadata

    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)


async def test_paused_run_aborted_by_the_operator_ends_failed_saying_who(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    spec, _ = blocked_spec(tmp_path)
    request = OperationInput(project=project, spec=spec, auto_approve=True, on_failure="pause")
    handle = await start_run(temporal_client, stack_env, request)
    await wait_phase(handle, "awaitingDecision")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("approve", ApprovalInput(by="nobody"))
    assert "not awaiting approval" in str(refused.value.cause)
    await handle.execute_update("abort", ApprovalInput(by="oncall"))
    result = await handle.result()
    assert result.phase == "failed" and "aborted by oncall" in (result.error or "")
    [release] = all_releases(stack_env, project)
    assert release.phase == "failed" and "aborted by oncall" in (release.error or "")
    assert sorted(r.id.rsplit("/", 1)[-1] for r in release.state.resources) == ["ok1", "ok2"]


async def test_approve_and_reject_together_only_one_wins(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    spec = {"resources": [file_resource(tmp_path / "f", "f\n")]}
    handle = await start_run(temporal_client, stack_env, OperationInput(project=project, spec=spec))
    await wait_phase(handle, "awaitingApproval")
    outcomes = await asyncio.gather(
        handle.execute_update("approve", ApprovalInput(by="ann")),
        handle.execute_update("reject", ApprovalInput(by="bob")),
        return_exceptions=True,
    )
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(won) == 1, outcomes
    result = await handle.result()
    [release] = all_releases(stack_env, project)
    assert release.approval is not None
    if str(won[0]).startswith("approved"):
        assert result.phase == "succeeded" and release.approval.by == "ann"
    else:
        assert result.phase == "failed" and release.approval.by == "bob"


@workflow.defn(name="ApplyWorkflow")
class BrokenApply(ApplyWorkflow):
    """The real ApplyWorkflow with a bug planted in its workflow code."""

    @workflow.run
    async def run(self, request: OperationInput) -> OperationResult:
        return await super().run(request)

    async def _preview(self, plan: OperationPlan, *args: object, **options: object) -> None:
        raise KeyError("planted bug")


async def test_an_error_in_workflow_code_fails_the_run_and_closes_the_release(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    project = new_project()
    spec = {"resources": [file_resource(tmp_path / "f", "f\n")]}
    async with local_worker(temporal_client, stack_env, [BrokenApply], "broken") as (
        queue,
        backend,
    ):
        handle = await start_run(
            temporal_client,
            stack_env,
            OperationInput(project=project, spec=spec, auto_approve=True),
            queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=60)
        assert "internal error in the apply workflow: KeyError" in str(failed.value.cause)
        [release] = backend.list(StackRef(project, "default"))
        assert release.phase == "failed" and "planted bug" in (release.error or "")
        assert backend.lock(StackRef(project, "default")) is None


async def test_fail_fast_also_stops_the_delete_walk(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    keep, gone = file_resource(tmp_path / "keep", "k\n"), file_resource(tmp_path / "gone", "g\n")
    first = write_spec(tmp_path / "v1.yaml", [keep, gone])
    assert run_cli(stack_env, "apply", "-f", str(first), "-p", project, "--yes").returncode == 0
    spec, _ = blocked_spec(tmp_path)
    second = write_spec(tmp_path / "v2.yaml", [keep, spec["resources"][1]])
    out = cli_json(
        run_cli(
            stack_env,
            "apply",
            "-f",
            str(second),
            "-p",
            project,
            "--yes",
            "--fail-fast",
            "-o",
            "json",
        )
    )
    assert out["phase"] == "failed"
    statuses = {r["id"]: r["status"] for r in out["results"]}
    assert statuses[gone["id"]] == "skipped"
    assert (tmp_path / "gone").exists()  # not deleted after the failure


async def test_destroy_deletes_along_kusion_path_references(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    base = file_resource(tmp_path / "base", "base\n")
    user = file_resource(tmp_path / "user", f"$kusion_path.{base['id']}.content")
    spec = write_spec(tmp_path / "spec.yaml", [base, user])  # no dependsOn: only the reference
    assert run_cli(stack_env, "apply", "-f", str(spec), "-p", project, "--yes").returncode == 0
    [release] = all_releases(stack_env, project)
    assert {r.id: r.depends_on for r in release.state.resources}[user["id"]] == [base["id"]]
    assert run_cli(stack_env, "destroy", "-p", project, "--yes").returncode == 0
    handle = temporal_client.get_workflow_handle(workflow_id_for(StackRef(project, "default")))
    assert await scheduled_ids(handle, "delete_resource") == [user["id"], base["id"]]


async def test_a_walk_past_the_failure_limit_starts_no_more_batches(
    tmp_path: Path,
    stack_env: dict[str, str],
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch's input names the nodes that failed before it; past the limit the walk
    skips the batches left, saying why, instead of sending ever longer inputs."""
    from stackflow.workflows import base
    from stackflow.workflows.batch import BatchWorkflow

    monkeypatch.setattr(base, "NOT_OK_LIMIT", 2)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must go\n")
    files = [file_resource(blocker / f"f{i}", f"{i}\n") for i in range(10)]
    project = new_project()
    workflows = [ApplyWorkflow, BatchWorkflow]
    async with local_worker(temporal_client, stack_env, workflows, "limit") as (queue, backend):
        handle = await start_run(
            temporal_client,
            stack_env,
            OperationInput(
                project=project, spec={"resources": files}, auto_approve=True, batch_size=2
            ),
            queue=queue,
        )
        result = await asyncio.wait_for(handle.result(), timeout=120)
        # batches of two: the first two fail (2 not ok, not past the limit), then none starts
        assert result.phase == "failed" and result.counts == {"failed": 4, "skipped": 6}
        skipped = [r for r in result.results if r.status == "skipped"]
        assert [r.id for r in skipped] == [f["id"] for f in files[4:]]
        assert all("more than 2 nodes of this walk failed" in (r.error or "") for r in skipped)
        [release] = backend.list(StackRef(project, "default"))
        assert release.phase == "failed" and backend.lock(StackRef(project, "default")) is None
