"""A set run's one event stream: every member run's events, each with its ``stack`` and
``run_id``, served as a run's stream is (:func:`stackflow.api.events.stream`: NDJSON or SSE,
``?after=SEQ`` / ``Last-Event-ID``, ending after the set run's ``run_complete``).

The set run keeps an event log of its own in the state backend, under :func:`set_stack`;
while a stream is open, :class:`SetRelay` copies its members' new events into it before each
read, each under the key of its member run and seq, so any number of readers on any replica
copy each event once and every reader sees the same numbering. A member run's own
``run_complete`` is copied as ``stack_complete``: only the set run's ends the stream."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Sequence
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHistoryEventFilterType
from temporalio.service import RPCError

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import PAGE_LIMIT, EventType, NewEvent, RunEvent
from stackflow.state.event_follow import Ending, temporal_ending
from stackflow.state.protocols import RunEventLog
from stackflow.temporal.stack_set import SetView

CHAIN_LIMIT = 1000
"""Runs a set run's chain of continue-as-new is followed through at most."""


async def newest_run(client: Any, handle: Any) -> Any:
    """The run that ``handle``'s run continued as (as new, maybe more than once): where the
    set run's status and steps are now (``handle`` itself when it did not)."""
    for _ in range(CHAIN_LIMIT):
        described = await handle.describe()
        if described.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            return handle
        close = WorkflowHistoryEventFilterType.CLOSE_EVENT
        async for event in handle.fetch_history_events(event_filter_type=close):
            attributes = event.workflow_execution_continued_as_new_event_attributes
            handle = client.get_workflow_handle(handle.id, run_id=attributes.new_execution_run_id)
    return handle


def set_stack(name: str) -> StackRef:
    """Where a set's runs keep their event logs (``@set`` is no project's name)."""
    return StackRef("@set", name)


class SetRelay:
    """The set run's log (a :class:`RunEventLog` for the stream) that first copies what its
    member runs appended since the last read."""

    def __init__(self, log: RunEventLog, name: str, handle: Any, client: Any, run: RunRef) -> None:
        self.log, self.handle, self.client, self.run = log, handle, client, run
        self.key = set_stack(name)
        self.cursors: dict[tuple[StackRef, str], int] = {}
        """Member run -> the last seq of it copied (or seen copied) by this reader."""
        self.ended: set[tuple[StackRef, str]] = set()

    def watch(self, view: SetView) -> None:
        for member in view.members:
            for run_id in member.runs:
                self.cursors.setdefault((member.stack, run_id), 0)

    def copy(self) -> None:
        """Append the member runs' new events to the set run's log."""
        fresh: list[NewEvent] = []
        for (stack, run_id), after in self.cursors.items():
            if (stack, run_id) in self.ended:
                continue
            page = self.log.events(stack, run_id, after=after)
            for event in page:
                done = event.type == EventType.run_complete
                if done:
                    self.ended.add((stack, run_id))
                fresh.append(
                    NewEvent(
                        type=EventType.stack_complete if done else event.type,
                        key=f"{run_id}/{event.seq}",
                        data={"stack": str(stack), "run_id": run_id, **event.data},
                        at=event.time,
                    )
                )
            if page:
                self.cursors[(stack, run_id)] = page[-1].seq
        if fresh:
            self.log.append_events(self.key, self.run, fresh)

    # ---- what the stream reads -------------------------------------------------------------
    def events(
        self, stack: StackRef, run_id: str, *, after: int = 0, limit: int = PAGE_LIMIT
    ) -> builtins.list[RunEvent]:
        self.copy()
        return self.log.events(stack, run_id, after=after, limit=limit)

    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None:
        return self.log.last_event(stack, run_id)

    def append_events(
        self, stack: StackRef, run: RunRef, events: Sequence[NewEvent]
    ) -> builtins.list[RunEvent]:
        return self.log.append_events(stack, run, events)

    async def closed(self) -> Ending | None:
        """Whether the set run has ended (then its members' last events are copied first);
        its members' runs are looked up again meanwhile."""
        with contextlib.suppress(RPCError):  # the run it continued as, if it did
            self.handle = await newest_run(self.client, self.handle)
        now = RunRef(self.run.workflow_id, self.handle.run_id or self.run.run_id)
        ending = await temporal_ending(self.client, now)
        with contextlib.suppress(RPCError):  # no worker to answer: read those known so far
            self.watch(await self.handle.query("status", result_type=SetView))
        if ending is not None:
            await asyncio.to_thread(self.copy)
        return ending
