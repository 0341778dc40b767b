"""The Temporal server proper on PostgreSQL (`make test-server`): its persistence, and a
300-resource apply on two workers cut by a cancel, a terminate or a reset in the middle of the
walk, finished by the next run with every resource applied once. A cancel waits for the nodes
in flight to end and records them, so every file the cut run wrote is in its release; a
terminate or a reset cannot wait (the run is gone at once), so what was in flight and not
recorded is applied again by the next run (idempotently).

Skipped unless STACKFLOW_TEMPORAL_MODE=server (set by `make test-server`): the dev server runs
on SQLite, and the 300-resource runs are not part of `make test`. The SIGKILL of one of two
workers mid-walk at this size is test_shared_state.py's
test_two_hosts_and_a_laptop_share_postgres_and_survive_a_sigkill, which `make test-server` runs
too.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from stackflow.temporal.operation import OperationInput, OperationResult, StatusView
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
    write_spec,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("STACKFLOW_TEMPORAL_MODE", "dev") != "server",
    reason="needs the Temporal server on PostgreSQL: `make test-server` "
    "(STACKFLOW_TEMPORAL_MODE=server); the dev server runs on SQLite",
)

COUNT = 300


def temporal_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["temporal", *args, "--address", env["TEMPORAL_ADDRESS"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )


def test_cluster_describe_reports_postgresql_persistence(stack_env: dict[str, str]) -> None:
    proc = temporal_cli(stack_env, "operator", "cluster", "describe", "--output", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cluster = json.loads(proc.stdout)
    assert cluster["persistenceStore"] == "postgres12", cluster
    assert cluster["visibilityStore"] == "postgres12", cluster
    assert cluster["serverVersion"] == "1.32.2", cluster
    names = temporal_cli(
        stack_env, "operator", "search-attribute", "list", "--namespace", "default", "-o", "json"
    )
    assert names.returncode == 0, names.stdout + names.stderr
    for name in ("StackflowProject", "StackflowWorkspace", "StackflowPhase", "StackflowDrift"):
        assert f'"{name}"' in names.stdout, name


@pytest.fixture
def two_hosts(tmp_path: Path, stack_env: dict[str, str]) -> Iterator[list[WorkerProcess]]:
    """Two workers on the test's task queue, each with its own home, as two hosts."""
    hosts = []
    for name in ("host-a", "host-b"):
        home = tmp_path / name
        home.mkdir()
        hosts.append(
            WorkerProcess(
                home, stack_env["STACKFLOW_TASK_QUEUE"], dict(stack_env, STACKFLOW_HOME=str(home))
            )
        )
    try:
        for h in hosts:
            h.start()
        yield hosts
    finally:
        for h in hosts:
            h.stop()


def files_spec(root: Path) -> dict[str, Any]:
    return {
        "resources": [file_resource(root / f"f{i:03d}", f"content {i}\n") for i in range(COUNT)]
    }


async def cut_mid_walk(
    client: Client, env: dict[str, str], project: str, root: Path
) -> WorkflowHandle[Any, Any]:
    """Start the 300-file apply (two at a time, so both hosts work) and return once 40 files
    are applied and the walk is still under way."""
    request = OperationInput(
        project=project, spec=files_spec(root), auto_approve=True, max_concurrency=2
    )
    handle = await start_run(client, env, request)

    async def under_way() -> StatusView | None:
        status = await handle.query("status", result_type=StatusView)
        return status if status.phase == "applying" and status.done >= 40 else None

    status = await poll(under_way, timeout=120, what="40 resources applied")
    assert status.done < COUNT
    return handle


async def assert_applied_once(
    client: Client, env: dict[str, str], project: str, root: Path
) -> None:
    """The run that finished applied exactly what the cut one had not recorded, each resource
    once; together they applied every resource; the last release holds each one once and every
    file is right."""
    first, *_, last = all_releases(env, project)
    assert first.workflow_id and last.workflow_id
    # each release's own run (a handle without a run id would read the latest run's history)
    handle = client.get_workflow_handle(first.workflow_id, run_id=first.run_id)
    follow = client.get_workflow_handle(last.workflow_id, run_id=last.run_id)
    assert last.phase == "succeeded", last.error
    done_before = {r.id for r in first.state.resources}
    everything = {f"onprem:File:{root / f'f{i:03d}'}" for i in range(COUNT)}
    assert done_before < everything, "the cut run must have left work for the next"
    scheduled_first = Counter(await scheduled_ids(handle, "apply_resource"))
    assert set(scheduled_first.values()) == {1}, "no resource applied twice by the cut run"
    scheduled_next = Counter(await scheduled_ids(follow, "apply_resource"))
    assert set(scheduled_next.values()) == {1}, "no resource applied twice by the next run"
    assert set(scheduled_next) == everything - done_before
    assert set(scheduled_first) | set(scheduled_next) == everything
    # started by both runs: only what was in flight when the run was cut and not recorded
    # (with max_concurrency 2, two groups of 8 nodes at most); OnPrem writes are idempotent
    both = set(scheduled_first) & set(scheduled_next)
    print(f"cut after {len(done_before)} recorded; {len(both)} in flight, started again")
    assert len(both) <= 16, sorted(both)
    ids = [r.id for r in last.state.resources]
    assert sorted(ids) == sorted(everything) and len(ids) == COUNT
    for i in range(COUNT):
        assert (root / f"f{i:03d}").read_text() == f"content {i}\n"


async def test_cancel_mid_walk_of_300_on_two_workers_then_the_next_apply_finishes(
    tmp_path: Path,
    stack_env: dict[str, str],
    two_hosts: list[WorkerProcess],
    temporal_client: Client,
) -> None:
    project, root = new_project(), tmp_path / "files"
    handle = await cut_mid_walk(temporal_client, stack_env, project, root)
    await handle.cancel()  # the Temporal UI's Cancel
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    [cut] = all_releases(stack_env, project)
    assert cut.phase == "failed" and "cancelled" in (cut.error or ""), cut.error
    # the nodes in flight ended and were recorded before the release closed: every file the
    # cut run wrote is in its release (nodes of a group that had not started when the cancel
    # came were never applied; the next run applies them, for the first time)
    written = {f"onprem:File:{path}" for path in root.iterdir()}
    assert written == {r.id for r in cut.state.resources}

    follow = await start_run(
        temporal_client,
        stack_env,
        OperationInput(project=project, spec=files_spec(root), auto_approve=True),
    )
    result: OperationResult = await follow.result()
    assert result.phase == "succeeded", result.error
    await assert_applied_once(temporal_client, stack_env, project, root)
    assert await assert_histories_replay(temporal_client, project, at_least=2) >= 2


async def test_terminate_mid_walk_of_300_on_two_workers_then_the_next_apply_finishes(
    tmp_path: Path,
    stack_env: dict[str, str],
    two_hosts: list[WorkerProcess],
    temporal_client: Client,
) -> None:
    project, root = new_project(), tmp_path / "files"
    handle = await cut_mid_walk(temporal_client, stack_env, project, root)
    await handle.terminate("test: terminated mid-walk")

    # the next apply, through the CLI, recovers the stack from the terminated run
    spec_file = write_spec(tmp_path / "spec.yaml", files_spec(root)["resources"])
    done = run_cli(stack_env, "apply", "-f", str(spec_file), "-p", project, "--yes", "-o", "json")
    assert cli_json(done)["phase"] == "succeeded", done.stderr
    first, second = all_releases(stack_env, project)
    assert first.phase == "failed" and "was terminated" in (first.error or ""), first.error
    assert second.run_id != first.run_id
    await assert_applied_once(temporal_client, stack_env, project, root)


async def test_reset_mid_walk_of_300_on_two_workers_completes_under_the_new_run(
    tmp_path: Path,
    stack_env: dict[str, str],
    two_hosts: list[WorkerProcess],
    temporal_client: Client,
) -> None:
    project, root = new_project(), tmp_path / "files"
    handle = await cut_mid_walk(temporal_client, stack_env, project, root)
    old_run = handle.result_run_id
    reset = temporal_cli(
        stack_env,
        "workflow",
        "reset",
        "--workflow-id",
        handle.id,
        "--run-id",
        old_run or "",
        "--type",
        "FirstWorkflowTask",
        "--reason",
        "test: reset mid-walk",
    )
    assert reset.returncode == 0, reset.stdout + reset.stderr
    follow = temporal_client.get_workflow_handle(handle.id, result_type=OperationResult)
    result = await follow.result()
    assert result.phase == "succeeded", result.error
    first, second = all_releases(stack_env, project)
    assert first.phase == "failed" and first.run_id == old_run
    assert second.run_id != old_run
    await assert_applied_once(temporal_client, stack_env, project, root)
    assert await assert_histories_replay(temporal_client, project, at_least=2) >= 2
