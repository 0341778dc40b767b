"""Appending a run's events from its activities (:mod:`stackflow.model.events`).

An :class:`EventSink` belongs to one activity attempt: it buffers what the activity reports
and appends it to the run's stream every :data:`FLUSH_SECONDS` in the background and when the
activity ends, so a resource's ``apply_complete`` reaches readers well within a second while a
group of a thousand nodes costs a handful of transactions. Keys are scoped by the activity
(its workflow run and activity id, which a retry keeps): a retried activity appends nothing
twice, a new activity (a retry walk of the run) appends its own events.

An event that cannot be appended in the background stays buffered for the next flush; the
final flush raises like any state write (the activity is retried, its events deduplicated).
Each node's end is also counted in stackflow's metrics (:mod:`stackflow.temporal.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.diff import Action, Change
from stackflow.model.events import EventType, NewEvent, resource_ref, short
from stackflow.state.protocols import RunEventLog
from stackflow.temporal import metrics

FLUSH_SECONDS = 0.2


def activity_scope() -> str:
    """What makes an activity's keys its own: its workflow run and activity id (the same on
    every attempt); outside an activity (tests) a scope of its own."""
    if not activity.in_activity():
        return uuid.uuid4().hex
    info = activity.info()
    return f"{info.workflow_run_id}/{info.activity_id}"


class EventSink:
    def __init__(self, log: RunEventLog, stack: StackRef, run: RunRef) -> None:
        self.log, self.stack, self.run = log, stack, run
        self.scope = activity_scope()
        self._buffer: list[NewEvent] = []
        self._started: dict[str, tuple[float, str | None, str]] = {}
        self._lock = asyncio.Lock()

    # ---- what an activity reports ------------------------------------------------------------
    def add(self, type: EventType, subject: str, data: dict[str, Any]) -> None:
        """An event keyed by this activity and ``subject``."""
        key = f"{self.scope}/{type}/{subject}"
        self._buffer.append(NewEvent(type=type, key=key, data=data, at=datetime.now(UTC)))

    def started(self, resource_id: str, resource_type: str | None, action: str) -> None:
        self._started[resource_id] = (time.monotonic(), resource_type, action)
        self.add(
            EventType.apply_start,
            resource_id,
            {"resource": resource_ref(resource_id, resource_type), "action": action},
        )

    def completed(self, resource_id: str) -> None:
        began, resource_type, action = self._started[resource_id]
        metrics.current().resource_done(
            resource_type, action, "succeeded", time.monotonic() - began
        )
        self.add(
            EventType.apply_complete,
            resource_id,
            {
                "resource": resource_ref(resource_id, resource_type),
                "action": action,
                "elapsed_seconds": round(time.monotonic() - began, 3),
            },
        )

    def errored(self, resource_id: str, action: str, error: str, error_type: str | None) -> None:
        """A node failed for good (not a failure its activity retries)."""
        began, resource_type, action = self._started.get(resource_id, (None, None, action))
        metrics.current().resource_done(resource_type, action, "failed")
        self.add(
            EventType.apply_errored,
            resource_id,
            {
                "resource": resource_ref(resource_id, resource_type),
                "action": action,
                "error": short(error),
                "error_type": error_type,
                "elapsed_seconds": None if began is None else round(time.monotonic() - began, 3),
            },
        )

    # ---- appending -------------------------------------------------------------------------
    async def flush(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            batch, self._buffer = self._buffer, []
            try:
                await asyncio.to_thread(self.log.append_events, self.stack, self.run, batch)
            except BaseException:
                self._buffer[:0] = batch  # kept for the next flush (deduplicated by key)
                raise

    async def _flush_often(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            with contextlib.suppress(Exception):  # kept; the final flush raises
                await self.flush()


@contextlib.asynccontextmanager
async def event_sink(log: RunEventLog, stack: StackRef, run: RunRef) -> AsyncIterator[EventSink]:
    """A sink flushed in the background while the block runs and once more when it ends,
    also when it raises (what it reported before the failure is kept; a failure to append
    then does not hide the block's own)."""
    sink = EventSink(log, stack, run)
    task = asyncio.create_task(sink._flush_often())

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        yield sink
    except BaseException:
        await stop()
        with contextlib.suppress(Exception):
            await sink.flush()
        raise
    await stop()
    await sink.flush()


def current_run() -> RunRef | None:
    """The run of the calling activity (None outside one: nothing to append to)."""
    if not activity.in_activity():
        return None
    info = activity.info()
    return RunRef(info.workflow_id or "", info.workflow_run_id or "")


def record_events(
    log: RunEventLog, stack: StackRef, run: RunRef | None, events: list[NewEvent]
) -> list[NewEvent]:
    """Append ``events`` now (blocking), keyed by the calling activity except the one-per-run
    ones (``run_start``, ``run_complete``); they are returned as keyed."""
    if run is None or not events:
        return []
    scope = activity_scope()
    once = {EventType.run_start, EventType.run_complete}
    keyed = [
        e if e.type in once else e.model_copy(update={"key": f"{scope}/{e.key}"}) for e in events
    ]
    log.append_events(stack, run, keyed)
    return keyed


def planned_changes(changes: Iterable[Change]) -> list[NewEvent]:
    """A preview's ``planned_change`` events: one per resource it would change."""
    return [
        NewEvent(
            type=EventType.planned_change,
            key=f"planned_change/{change.id}",
            data={
                "resource": resource_ref(change.id, change.type),
                "action": change.action.value,
                "drift": bool(change.drift),
            },
        )
        for change in changes
        if change.action is not Action.UnChanged
    ]
