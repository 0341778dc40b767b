"""The worker registers every activity once, under the names the workflows' histories hold."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio import activity

from stackflow.activities import WorkerActivities
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import open_backend
from stackflow.state.cache import PriorStateCache

HISTORY_NAMES = {
    "prepare_operation",
    "preview_batch",
    "describe_changes",
    "index_diffs",
    "evaluate_policy",
    "load_batch",
    "set_phase",
    "append_events",
    "notification_targets",
    "deliver_notification",
    "record_notification_failure",
    "apply_resource",
    "delete_resource",
    "run_group",
    "refresh_batch",
    "record_drift",
    "prepare_set",
    "resolve_member",
    "forward_approval",
}


def test_registered_names_are_the_history_names(tmp_path: Path) -> None:
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}", migrate=True)
    try:
        acts = WorkerActivities.create(RuntimeRegistry(), backend, PriorStateCache(None, backend))
        names = [activity._Definition.must_from_callable(fn).name for fn in acts.all()]
    finally:
        backend.close()
    assert sorted(names) == sorted(HISTORY_NAMES)


def test_golden_histories_schedule_only_registered_activities() -> None:
    """Every activity a committed golden history schedules is registered under that name."""
    scheduled: set[str] = set()
    for path in (Path(__file__).resolve().parents[1] / "golden").glob("*.json"):
        for event in json.loads(path.read_text()).get("events", []):
            attributes = event.get("activityTaskScheduledEventAttributes")
            if attributes:
                scheduled.add(attributes["activityType"]["name"])
    assert len(scheduled) >= 9, scheduled
    assert scheduled <= HISTORY_NAMES
