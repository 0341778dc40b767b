"""Recorded histories replay with the current workflow code, children included."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import OperationInput, OperationResult, workflow_id_for
from stackflow.workflows.constants import BASELINE
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    closed_runs,
    dir_resource,
    file_resource,
    new_project,
)


async def test_batched_apply_and_destroy_histories_replay(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """batch_size 3 over 7 nodes: the walk runs in BatchWorkflow children, in order."""
    project = new_project()
    root = tmp_path / "tree"
    d = dir_resource(root)
    files = [file_resource(root / f"{i}.txt", f"{i}\n", deps=[d["id"]]) for i in range(6)]
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    workflow_id = workflow_id_for(StackRef(project, "default"))
    request = OperationInput(
        project=project, spec={"resources": [d, *files]}, auto_approve=True, batch_size=3
    )
    applied = await temporal_client.execute_workflow(
        "ApplyWorkflow", request, id=workflow_id, task_queue=queue, result_type=OperationResult
    )
    assert applied.phase == "succeeded" and applied.counts == {"succeeded": 7}
    assert sorted(p.name for p in root.iterdir()) == [f"{i}.txt" for i in range(6)]

    destroyed = await temporal_client.execute_workflow(
        "DestroyWorkflow",
        OperationInput(project=project, auto_approve=True, batch_size=3),
        id=workflow_id,
        task_queue=queue,
        result_type=OperationResult,
    )
    assert destroyed.phase == "succeeded" and destroyed.counts == {"succeeded": 7}
    assert not root.exists()
    assert [r.phase for r in all_releases(stack_env, project)] == ["succeeded", "succeeded"]

    # 2 parents + 3 apply children + 3 destroy children
    assert await assert_histories_replay(temporal_client, project, at_least=8) == 8
    children = [wid for wid, _ in await closed_runs(temporal_client, project) if "/r" in wid]
    assert sorted(children) == [
        f"{workflow_id}/r1/apply-0",
        f"{workflow_id}/r1/apply-1",
        f"{workflow_id}/r1/apply-2",
        f"{workflow_id}/r2/destroy-0",
        f"{workflow_id}/r2/destroy-1",
        f"{workflow_id}/r2/destroy-2",
    ]
    for wid, run_id in await closed_runs(temporal_client, project):
        patches, versions, scheduled = await _patch_events(temporal_client, wid, run_id)
        # one marker and one TemporalChangeVersion write a run, whatever it went through
        assert patches == [BASELINE] and versions == [[BASELINE]], wid
        # the state activities run locally since the baseline
        assert not {"prepare_operation", "set_phase", "append_events"} & set(scheduled), wid


async def _patch_events(
    client: Client, workflow_id: str, run_id: str
) -> tuple[list[str], list[object], list[str]]:
    """The patch ids a run's markers record, its TemporalChangeVersion upserts, and the
    activity types it scheduled."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    patches, versions, scheduled = [], [], []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                [data] = marker.details["patch-data"].payloads
                patches.append(json.loads(data.data)["id"])
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
            if "TemporalChangeVersion" in fields.indexed_fields:
                versions.append(json.loads(fields.indexed_fields["TemporalChangeVersion"].data))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled.append(attrs.activity_type.name)
    return patches, versions, scheduled
