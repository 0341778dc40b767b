"""The local-small-preview patch: a small apply or destroy that nothing can stop between its
preview and its walk previews in a local activity, so the run is two workflow tasks and one
activity; its preview is recorded as before (events, release). A run that waits for an
approver (or has a policy bundle, which may ask for one) previews as an activity and applies
nothing before the approval."""

from __future__ import annotations

from pathlib import Path

from temporalio.api.enums.v1 import EventType as HistoryEvent
from temporalio.client import Client, WorkflowHandle

from stackflow.core.refs import StackRef
from stackflow.model.events import EventType
from stackflow.policy_gate.bundle import PolicyBundle, store_bundle
from stackflow.temporal.operation import ApprovalInput, OperationInput, OperationResult
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    file_resource,
    new_project,
    releases,
    start_run,
    wait_phase,
)
from tests.integration.test_replay import _patch_events

ASK = """package stackflow

import rego.v1

require_approval contains {"msg": "a person looks", "resource": "*"} if input.summary.Create > 0
"""


async def _shape(handle: WorkflowHandle[object, object]) -> tuple[int, list[str]]:
    """A run's completed workflow tasks and the activity types it scheduled."""
    tasks, scheduled = 0, []
    async for event in handle.fetch_history_events():
        if event.event_type == HistoryEvent.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks += 1
        elif event.event_type == HistoryEvent.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return tasks, scheduled


def _events(env: dict[str, str], project: str, run_id: str) -> list[tuple[str, object]]:
    backend = releases(env)
    try:
        found = backend.events(StackRef(project, "default"), run_id)
    finally:
        backend.close()
    return [(e.type, e.data.get("phase") or e.data.get("action")) for e in found]


async def test_a_small_auto_approved_run_previews_in_its_first_workflow_task(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env, project = stack_env, new_project()
    files = [file_resource(tmp_path / "site" / f"{i}.txt", f"{i}\n") for i in range(2)]
    request = OperationInput(project=project, spec={"resources": files}, auto_approve=True)
    applied = await start_run(temporal_client, env, request)
    result = await applied.result()
    assert result.phase == "succeeded" and result.counts == {"succeeded": 2}
    assert [c["action"] for c in result.changes["changes"]] == ["Create", "Create"]
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["0.txt", "1.txt"]
    assert await _shape(applied) == (2, ["run_group"])
    patches, _, _ = await _patch_events(temporal_client, applied.id, applied.result_run_id or "")
    assert len(patches) == 1  # the baseline marker stands for the new patch too

    # the preview is recorded as an activity's was: its planned changes and summary come
    # before the apply phase, the apply's events after it
    events = _events(env, project, applied.result_run_id or "")
    kinds = [kind for kind, _ in events]
    assert events.count((EventType.planned_change, "Create")) == 2
    applying = events.index((EventType.phase, "applying"))
    assert kinds.index(EventType.change_summary) < applying
    assert max(i for i, k in enumerate(kinds) if k == EventType.planned_change) < applying
    assert kinds.index(EventType.apply_complete) > applying
    [release] = all_releases(env, project)
    assert release.phase == "succeeded" and release.changes is not None

    destroyed = await start_run(
        temporal_client,
        env,
        OperationInput(project=project, auto_approve=True),
        workflow="DestroyWorkflow",
    )
    assert (await destroyed.result()).counts == {"succeeded": 2}
    assert not list((tmp_path / "site").iterdir())
    assert await _shape(destroyed) == (2, ["run_group"])
    assert await assert_histories_replay(temporal_client, project, at_least=2) == 2


async def test_a_run_that_waits_for_an_approver_previews_as_an_activity(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env, project = stack_env, new_project()
    target = tmp_path / "site" / "a.txt"
    request = OperationInput(project=project, spec={"resources": [file_resource(target, "a\n")]})
    handle = await start_run(temporal_client, env, request)
    await wait_phase(handle, "awaitingApproval")
    assert not target.exists()  # nothing applied before the approval
    assert (await _shape(handle))[1] == ["preview_batch"]
    await handle.execute_update("approve", ApprovalInput(by="approver"))
    result: OperationResult = await handle.result()
    assert result.phase == "succeeded" and target.read_text() == "a\n"
    assert (await _shape(handle))[1] == ["preview_batch", "apply_resource"]
    assert await assert_histories_replay(temporal_client, project, at_least=1) == 1


async def test_a_run_with_a_policy_bundle_previews_as_an_activity_and_is_judged(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env, project = stack_env, new_project()
    backend = releases(env)
    try:
        ask = store_bundle(backend, PolicyBundle(modules={"ask.rego": ASK}))
    finally:
        backend.close()
    target = tmp_path / "site" / "a.txt"
    spec = {"resources": [file_resource(target, "a\n")]}
    request = OperationInput(project=project, spec=spec, auto_approve=True, policy_ref=ask)
    handle = await start_run(temporal_client, env, request)
    await wait_phase(handle, "awaitingApproval")  # the bundle asked, despite auto_approve
    assert not target.exists()
    assert (await _shape(handle))[1] == ["preview_batch", "evaluate_policy"]
    await handle.execute_update("approve", ApprovalInput(by="approver"))
    result: OperationResult = await handle.result()
    assert result.phase == "succeeded" and target.read_text() == "a\n"
