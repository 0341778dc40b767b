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

from stackflow.codec import data_converter
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
