"""Upgrades never break runs in flight: every committed golden history (approval wait,
batched apply with its children, failed node, pause and retry, destroy, cancel) replays
against today's workflow code. A change that does not replay must be versioned
(``workflow.patched``); re-record with tests/golden/record.py only on purpose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from stackflow.model.policy import PolicyDecision
from stackflow.temporal.codec import data_converter
from stackflow.workflows.catalog import ALL_WORKFLOWS

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
IDS = json.loads((GOLDEN / "workflow_ids.json").read_text())
HISTORIES = sorted(p for p in GOLDEN.glob("*.json") if p.name in IDS)
EXPECTED = {
    "approval_wait",
    "batched_apply",
    "failed_node",
    "paused_retry",
    "destroy",
    "cancelled",
    "rollback",
    "drift",
    "refresh",
    "grouped_apply",
    "grouped_destroy",
    "events_approval",
    "events_paused_abort",
    "events_preview",
    "policy_approval",
    "policy_denied",
    "policy_preview_denied",
    "local_phase_apply",
    "local_phase_cancelled",
    "whole_terraform_apply",
    "whole_terraform_destroy",
    "whole_onprem_apply",
    "whole_onprem_destroy",
    "sliding_preview",
    "grouped_preview",
    "baseline_apply",
    "baseline_destroy",
    "baseline_approval",
    "plan_grouping_apply",
    "plan_grouping_destroy",
    "set_continued_1",
    "set_continued_2",
    "set_continued_3",
    "set_apply",
    "set_rollout",
    "local_preview_apply",
    "local_preview_destroy",
}


def test_the_golden_set_is_complete() -> None:
    names = {path.name.split(".")[0] for path in HISTORIES}
    assert {p.name for p in GOLDEN.glob("*.json")} == {*IDS, "workflow_ids.json"}
    assert names >= EXPECTED
    assert any(".apply-" in path.name for path in HISTORIES), "no BatchWorkflow child recorded"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_golden_history_replays(path: Path) -> None:
    raw = json.loads(path.read_text())
    history = WorkflowHistory.from_json(IDS[path.name], raw)
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


async def _policy_decisions(name: str) -> list[PolicyDecision]:
    """The policy gate's decisions as the golden history ``name`` recorded them."""
    history = WorkflowHistory.from_json(IDS[name], json.loads((GOLDEN / name).read_text()))
    converter = data_converter()
    scheduled: dict[int, str] = {}
    found = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled[event.event_id] = (
                event.activity_task_scheduled_event_attributes.activity_type.name
            )
        if event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if scheduled.get(done.scheduled_event_id) == "evaluate_policy":
                payloads = list(done.result.payloads)
                [decision] = await converter.decode(payloads, [PolicyDecision])
                found.append(decision)
    return found


async def test_the_policy_decisions_are_in_the_golden_histories() -> None:
    """A policy decision is replayed from history, not evaluated again: each golden run
    holds exactly one, with its digests and messages."""
    [asked] = await _policy_decisions("policy_approval.json")
    assert asked.outcome == "require_approval" and asked.counts == {
        "require_approval": 1,
        "warn": 2,
    }
    assert asked.bundles[0].scope == "project" and asked.input_digest.startswith("sha256:")
    [denied] = await _policy_decisions("policy_denied.json")
    assert denied.outcome == "deny" and denied.counts == {"deny": 2}
    assert {m.policy for m in denied.messages} == {"run/deny.rego"}
    [refused] = await _policy_decisions("policy_preview_denied.json")
    assert refused.outcome == "deny" and refused.bundles[0].scope == "run"
