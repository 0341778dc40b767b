"""One system of record: workers on different hosts (homes) share the state backend, the
lock belongs to a run, and every way a run ends leaves its stack usable.

Each worker here has its own STACKFLOW_HOME and working directories, as two hosts would;
they and the CLI (a third home) share only Temporal and the state backend.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError

from stackflow.core.refs import StackRef
from stackflow.state.backend import open_backend
from stackflow.temporal.operation import (
    ApprovalInput,
    OperationInput,
    OperationResult,
    StatusView,
)
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    cli_json,
    file_resource,
    new_project,
    poll,
    scheduled_ids,
    start_run,
    wait_phase,
    write_spec,
)

RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"


def host(tmp_path: Path, env: dict[str, str], name: str, **extra: str) -> WorkerProcess:
    """A worker as another host would run it: its own home and working dirs."""
    home = tmp_path / name
    home.mkdir()
    return WorkerProcess(
        home, env["STACKFLOW_TASK_QUEUE"], dict(env, STACKFLOW_HOME=str(home), **extra)
    )


def files_spec(root: Path, count: int) -> dict[str, Any]:
    return {
        "resources": [file_resource(root / f"f{i:03d}", f"content {i}\n") for i in range(count)]
    }


async def test_two_hosts_and_a_laptop_share_postgres_and_survive_a_sigkill(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    assert stack_env["STACKFLOW_STATE_URL"].startswith("postgresql")
    a, b = host(tmp_path, stack_env, "host-a"), host(tmp_path, stack_env, "host-b")
    laptop = dict(stack_env, STACKFLOW_HOME=str(tmp_path / "laptop"))
    a.start()
    b.start()
    try:
        project, count = new_project(), 300
        root = tmp_path / "files"
        spec = files_spec(root, count)
        # two calls at once: OnPrem groups of 32, two in flight, ten in all (still under way
        # when the poll sees the first ones done)
        request = OperationInput(project=project, spec=spec, auto_approve=True, max_concurrency=2)
        handle = await start_run(temporal_client, stack_env, request)

        async def under_way() -> StatusView | None:
            status = await handle.query("status", result_type=StatusView)
            return status if status.phase == "applying" and status.done >= 40 else None

        await poll(under_way, timeout=90, what="40 resources applied")
        a.kill()  # SIGKILL one host mid-walk; host b carries on, and picks up a's activities
        result = await handle.result()
        assert result.phase == "succeeded", result.error
        assert [r.status for r in result.results] == ["succeeded"] * count

        # every resource applied exactly once: one activity each in history, one state each
        scheduled = Counter(await scheduled_ids(handle, "apply_resource"))
        assert len(scheduled) == count and set(scheduled.values()) == {1}
        [release] = all_releases(stack_env, project)
        ids = [r.id for r in release.state.resources]
        assert sorted(ids) == sorted(r["id"] for r in spec["resources"]) and len(set(ids)) == count
        for i in range(count):
            assert (root / f"f{i:03d}").read_text() == f"content {i}\n"

        # the CLI from a third home sees the release and previews against the same state
        listed = cli_json(run_cli(laptop, "release", "list", "-p", project, "-o", "json"))
        assert [(r["revision"], r["phase"], r["resources"]) for r in listed] == [
            (1, "succeeded", count)
        ]
        spec_file = write_spec(tmp_path / "spec.yaml", spec["resources"])
        again = cli_json(
            run_cli(laptop, "preview", "-f", str(spec_file), "-p", project, "-o", "json")
        )
        assert again["summary"]["UnChanged"] == count and again["summary"]["Create"] == 0
        assert not (tmp_path / "laptop" / "state.db").exists()  # nothing came from its disk
    finally:
        a.stop()
        b.stop()
    assert await assert_histories_replay(temporal_client, project, at_least=2) >= 2


@pytest.mark.parametrize("count", [1, 2], ids=["alone", "batch"])
async def test_terraform_apply_cut_after_tofu_resumes_on_another_host_without_a_second_create(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client, count: int
) -> None:
    project = new_project()
    rids = [f"hashicorp:random:random_id:token{i}" for i in range(count)]
    spec = {
        "resources": [
            {
                "id": rid,
                "type": "Terraform",
                "attributes": {"byte_length": 8},
                "extensions": {"provider": RANDOM, "resourceType": "random_id"},
            }
            for rid in rids
        ]
    }
    # Host a dies right after `tofu apply` created the resources (one command for a batch),
    # before stackflow records them; host b (empty working dirs) takes the retried activity.
    a = host(tmp_path, stack_env, "host-a", STACKFLOW_FAULT=f"after-tofu-apply:{rids[0]}")
    a.start()
    handle = await start_run(
        temporal_client, stack_env, OperationInput(project=project, spec=spec, auto_approve=True)
    )
    await poll(
        lambda: asyncio.to_thread(lambda: a.proc is not None and a.proc.poll() is not None),
        timeout=180,
        what="host a to die after tofu apply",
    )
    backend = open_backend(stack_env["STACKFLOW_STATE_URL"])
    try:
        created_by_a = {}
        for rid in rids:
            kept = backend.get_terraform_state(StackRef(project, "default"), rid)
            assert kept is not None, f"{rid}: tofu's state must be in the backend before the crash"
            created_by_a[rid] = _random_id(kept)
        b = host(tmp_path, stack_env, "host-b")
        b.start()
        try:
            result = await handle.result()
        finally:
            b.stop()
        assert result.phase == "succeeded", result.error
        [release] = all_releases(stack_env, project)
        recorded = {r.id: r.attributes["id"] for r in release.state.resources}
        assert recorded == created_by_a  # the same objects, not second ones
        for rid in rids:
            state = backend.get_terraform_state(StackRef(project, "default"), rid)
            assert state is not None and _random_id(state) == created_by_a[rid]
    finally:
        backend.close()


def _random_id(state_json: str) -> str:
    import json

    doc = json.loads(state_json)
    [resource] = [r for r in doc["resources"] if r["mode"] == "managed"]
    return str(resource["instances"][0]["attributes"]["id"])


@pytest.mark.parametrize("state_kind", ["sqlite", "postgresql"])
@pytest.mark.parametrize("when", ["previewing", "awaitingApproval", "applying"])
async def test_cancel_at_any_phase_closes_the_release_and_frees_the_stack(
    when: str,
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    # applying: one call at a time, OnPrem groups of 32, eight of them: still under way
    count = 2000 if when == "previewing" else 240
    spec = files_spec(root, count)
    request = OperationInput(
        project=project,
        spec=spec,
        auto_approve=when == "applying",
        max_concurrency=1,
    )
    handle = await start_run(temporal_client, stack_env, request)
    if when == "applying":

        async def applying() -> StatusView | None:
            status = await handle.query("status", result_type=StatusView)
            return status if status.phase == "applying" and status.done >= 3 else None

        await poll(applying, timeout=60, what="the apply under way")
    else:
        await wait_phase(handle, when, timeout=60)
    await handle.cancel()  # what the Temporal UI's Cancel button sends
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    [release] = all_releases(stack_env, project)
    assert release.phase == "failed" and "cancelled" in (release.error or ""), release.error
    if when == "applying":
        # the nodes in flight ended and were recorded before the release closed: the
        # cancelled release holds every file the run wrote, so none is applied twice
        written = {f"onprem:File:{path}" for path in root.iterdir()}
        assert written and written == {r.id for r in release.state.resources}
    backend = open_backend(stack_env["STACKFLOW_STATE_URL"])
    try:
        assert backend.lock(StackRef(project, "default")) is None
    finally:
        backend.close()

    # the next apply needs no unlock, and finishes what the cancelled one left
    follow = spec["resources"][:60]
    spec_file = write_spec(tmp_path / "spec.yaml", follow)
    done = run_cli(stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes", "-o", "json")
    assert cli_json(done)["phase"] == "succeeded", done.stderr
    assert len(list(root.iterdir())) == len(follow)


@pytest.mark.parametrize("state_kind", ["sqlite", "postgresql"])
async def test_terminate_during_approval_is_recovered_by_the_next_operation(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    spec = files_spec(root, 3)
    handle = await start_run(temporal_client, stack_env, OperationInput(project=project, spec=spec))
    await wait_phase(handle, "awaitingApproval")
    await handle.terminate("test: gone without a word")
    spec_file = write_spec(tmp_path / "spec.yaml", spec["resources"])
    done = run_cli(stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes", "-o", "json")
    assert cli_json(done)["phase"] == "succeeded", done.stderr
    first, second = all_releases(stack_env, project)
    assert first.phase == "failed" and "was terminated" in (first.error or "")
    assert second.phase == "succeeded" and len(second.state.resources) == 3


@pytest.mark.parametrize("state_kind", ["sqlite", "postgresql"])
async def test_forced_unlock_fences_the_old_run_and_destroy_removes_everything(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    spec = files_spec(root, 5)
    handle = await start_run(temporal_client, stack_env, OperationInput(project=project, spec=spec))
    await wait_phase(handle, "awaitingApproval")
    forced = run_cli(stack_env, "release", "unlock", "-p", project, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr

    # the old run goes on: its writes are refused, so nothing is created or recorded
    await handle.execute_update("approve", ApprovalInput(by="late approver"))
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert not root.exists() or not list(root.iterdir())
    [release] = all_releases(stack_env, project)
    assert release.phase == "failed" and release.state.resources == []
    assert "--force" in (release.error or "")

    # a new apply creates the files; a destroy removes every one of them
    spec_file = write_spec(tmp_path / "spec.yaml", spec["resources"])
    applied = run_cli(stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert len(list(root.iterdir())) == 5
    destroyed = run_cli(stack_env, "destroy", "-p", project, "--yes")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert list(root.iterdir()) == []
    assert all_releases(stack_env, project)[-1].state.resources == []


@pytest.mark.parametrize("state_kind", ["sqlite", "postgresql"])
async def test_reset_of_a_failed_apply_completes_under_the_new_run(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    blocker = root / "sub"
    root.mkdir()
    blocker.write_text("a file where a directory must go\n")  # so the apply fails
    spec = {"resources": [file_resource(blocker / "x", "x\n"), file_resource(root / "y", "y\n")]}
    handle = await start_run(
        temporal_client, stack_env, OperationInput(project=project, spec=spec, auto_approve=True)
    )
    failed = await handle.result()
    assert failed.phase == "failed"
    blocker.unlink()  # fix what made it fail, then reset the run as an operator would
    reset = subprocess.run(
        [
            "temporal",
            "workflow",
            "reset",
            "--address",
            stack_env["TEMPORAL_ADDRESS"],
            "--workflow-id",
            handle.id,
            "--run-id",
            handle.result_run_id or "",
            "--type",
            "FirstWorkflowTask",
            "--reason",
            "test: retry after fixing the file system",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=stack_env,
        cwd=REPO,
    )
    assert reset.returncode == 0, reset.stdout + reset.stderr
    new = temporal_client.get_workflow_handle(handle.id, result_type=OperationResult)
    result = await new.result()
    assert result.phase == "succeeded", result.error
    assert (blocker / "x").read_text() == "x\n"
    phases = [r.phase for r in all_releases(stack_env, project)]
    assert phases == ["failed", "succeeded"]
    assert all_releases(stack_env, project)[-1].run_id != handle.result_run_id


def test_apply_and_preview_work_with_redis_down(tmp_path: Path, stack_env: dict[str, str]) -> None:
    """Redis is a cache of prior state, never the truth: nothing listens on its port here."""
    env = dict(stack_env, REDIS_URL="redis://127.0.0.1:9/0")
    worker = host(tmp_path, env, "no-redis")
    worker.start()
    try:
        project, root = new_project(), tmp_path / "files"
        spec_file = write_spec(tmp_path / "spec.yaml", files_spec(root, 5)["resources"])
        done = run_cli(env, "apply", "-f", str(spec_file), "-p", project, "--yes", "-o", "json")
        assert cli_json(done)["phase"] == "succeeded", done.stderr
        again = cli_json(run_cli(env, "preview", "-f", str(spec_file), "-p", project, "-o", "json"))
        assert again["summary"]["UnChanged"] == 5
    finally:
        worker.stop()
    assert "redis unavailable" in worker.log.read_text()
