"""SIGKILL the worker in the middle of an apply; a new worker finishes the same run."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import (
    OperationInput,
    OperationResult,
    StatusView,
    workflow_id_for,
)
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    file_resource,
    new_project,
    poll,
    scheduled_ids,
)

FILES = 480
"""With one call at a time, OnPrem groups of 32: 15 groups, the run still applying when
the worker dies."""


async def test_worker_killed_mid_apply_is_replaced_and_the_run_completes(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    project = new_project()
    root = tmp_path / "files"
    spec = {
        "resources": [file_resource(root / f"f{i:03d}", f"content {i}\n") for i in range(FILES)]
    }
    # One file at a time, so the run is still applying when the worker dies.
    request = OperationInput(project=project, spec=spec, auto_approve=True, max_concurrency=1)
    handle = await temporal_client.start_workflow(
        "ApplyWorkflow",
        request,
        id=workflow_id_for(StackRef(project, "default")),
        task_queue=stack_env["STACKFLOW_TASK_QUEUE"],
        result_type=OperationResult,
    )

    async def some_done() -> StatusView | None:
        status = await handle.query("status", result_type=StatusView)
        return status if status.phase == "applying" and status.done >= 10 else None

    before = await poll(some_done, timeout=60, what="10 resources applied")
    worker_process.kill()  # SIGKILL: no graceful shutdown, an activity is in flight
    killed_at = time.monotonic()
    on_disk = len(list(root.iterdir()))
    assert before.done <= on_disk < FILES, "the run must be cut in the middle"
    [release] = all_releases(stack_env, project)
    assert release.phase == "applying"

    worker_process.start()
    result = await handle.result()
    recovered_in = time.monotonic() - killed_at
    assert result.phase == "succeeded", result.error
    assert [r.status for r in result.results] == ["succeeded"] * FILES
    assert recovered_in < 120

    # every file is right, and the state holds each resource exactly once
    for i in range(FILES):
        assert (root / f"f{i:03d}").read_text() == f"content {i}\n"
    assert sorted(p.name for p in root.iterdir()) == [f"f{i:03d}" for i in range(FILES)]
    [release] = all_releases(stack_env, project)
    assert release.phase == "succeeded"
    ids = [r.id for r in release.state.resources]
    assert len(ids) == FILES and len(set(ids)) == FILES

    # one activity per resource in the history: the killed attempt was retried, not re-planned
    scheduled = Counter(await scheduled_ids(handle, "apply_resource"))
    assert len(scheduled) == FILES and set(scheduled.values()) == {1}
    assert await assert_histories_replay(temporal_client, project, at_least=1) == 1
