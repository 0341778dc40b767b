"""A run's full diffs stay in the state backend; past a few preview batches their refs fold
into index blobs, so the run's view, result and release carry a few refs at any size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.state.diff_store import DIFF_REFS_LIMIT, load_changes
from stackflow.temporal.operation import OperationInput
from stackflow.workflows.apply import ApplyWorkflow
from tests.integration.opshelp import file_resource, local_worker, new_project, start_run


async def test_many_preview_batches_leave_a_few_diff_refs(
    tmp_path: Path,
    stack_env: dict[str, str],
    temporal_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stackflow.workflows import common

    monkeypatch.setattr(common, "PREVIEW_BATCH", 2)  # 50 files: 25 batches, each with a diff
    project = new_project()
    files = [file_resource(tmp_path / "d" / f"{i:02d}.txt", f"{i}\n") for i in range(50)]
    async with local_worker(temporal_client, stack_env, [ApplyWorkflow], "diffs") as (
        queue,
        backend,
    ):
        handle = await start_run(
            temporal_client,
            stack_env,
            OperationInput(project=project, spec={"resources": files}, auto_approve=True),
            queue=queue,
        )
        result = await asyncio.wait_for(handle.result(), timeout=120)
        indexed = [
            e
            async for e in handle.fetch_history_events()
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "index_diffs"
        ]
        assert result.phase == "succeeded" and result.counts == {"succeeded": 50}
        refs = result.changes["diff_refs"]
        # the 17th batch's ref (one past the limit) folds the 17 into one index; the eight
        # later batches add theirs (sliding-preview-window: checked after each batch)
        assert len(indexed) == 1 and len(refs) == 9 and len(refs) <= DIFF_REFS_LIMIT
        changes = load_changes(backend, refs)
        assert [c["id"] for c in changes] == [f["id"] for f in files]
        assert all(c["action"] == "Create" and c["diff"] for c in changes)
        release = backend.get(StackRef(project, "default"), result.revision)
        assert release.changes is not None and release.changes["diff_refs"] == refs
