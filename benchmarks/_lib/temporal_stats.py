"""Temporal work of a stack's runs, counted from their histories: how many workflow tasks,
activity tasks (and which), events and history bytes. Each workflow task and each activity
task is at least two round trips between worker and server (poll, then complete); heartbeats
and the CLI's queries come on top."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client

from stackflow.temporal.codec import data_converter


@dataclass
class RunStats:
    runs: int = 0
    events: int = 0
    bytes: int = 0
    workflow_tasks: int = 0
    activities: Counter[str] = field(default_factory=Counter)
    activity_attempts: int = 0
    max_run_events: int = 0
    max_run_bytes: int = 0

    def describe(self, resources: int) -> str:
        n = max(resources, 1)
        acts = sum(self.activities.values())
        kinds = ", ".join(f"{k} {v}" for k, v in self.activities.most_common())
        return (
            f"{self.runs} run(s), {self.workflow_tasks} workflow tasks "
            f"({self.workflow_tasks / n:.2f}/resource), {acts} activities "
            f"({acts / n:.2f}/resource: {kinds}; {self.activity_attempts - acts} retries), "
            f"{self.events} events ({self.events / n:.1f}/resource), "
            f"{self.bytes / 1024:.0f} KB of history; largest run {self.max_run_events} events, "
            f"{self.max_run_bytes / 1024:.0f} KB"
        )


async def stack_stats(workflow_id: str, since: float, *, previews: bool = False) -> RunStats:
    """Every run whose id starts with ``workflow_id`` and that started at or after ``since``
    (a Unix time): the operation's run and its batch children; with ``previews``, also
    ``stackflow preview``'s runs (``…/preview``)."""
    client = await Client.connect(
        os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
        namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    started = datetime.fromtimestamp(since, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    query = f'WorkflowId STARTS_WITH "{workflow_id}" AND StartTime >= "{started}"'
    stats = RunStats()
    async for execution in client.list_workflows(query):
        if execution.id.endswith("/preview") and not previews:
            continue
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        size = History(events=history.events).ByteSize()
        stats.runs += 1
        stats.events += len(history.events)
        stats.bytes += size
        stats.max_run_events = max(stats.max_run_events, len(history.events))
        stats.max_run_bytes = max(stats.max_run_bytes, size)
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                stats.workflow_tasks += 1
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                stats.activities[name] += 1
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                stats.activity_attempts += event.activity_task_started_event_attributes.attempt
    return stats
