"""Reading a run's event stream as it grows: the one loop the API's ``…/events`` and the CLI's
``stackflow events`` share.

Events come from the state backend (:class:`~stackflow.state.protocols.RunEventLog`), after a
``seq``; the loop polls every :data:`POLL_SECONDS` (sooner when the run's bell rings:
:mod:`stackflow.state.event_bell`) and ends after ``run_complete``. Every
:data:`CLOSED_CHECK_SECONDS` without one it asks Temporal whether the run has closed: a run
that ended without writing its ``run_complete`` (terminated, timed out, failed before it
could, or started before runs wrote events) gets one appended under the run's own key, so
every reader, on any API replica, sees the same single last event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import PAGE_LIMIT, EventType, RunEvent, run_complete
from stackflow.state.event_bell import Nudge
from stackflow.state.protocols import RunEventLog

POLL_SECONDS = 0.2
"""How often a follower looks for new events."""
CLOSED_CHECK_SECONDS = 2.0
"""How often a follower that sees nothing new asks Temporal whether the run has closed."""
DESCRIBE_TIMEOUT = timedelta(seconds=5)
"""The longest that question waits for Temporal's answer."""


class Ending(BaseModel):
    """How a closed run ended, as Temporal says."""

    status: str
    error: str | None = None


Closed = Callable[[], Awaitable[Ending | None]]
"""Asks whether the run has closed (None while it runs)."""


async def temporal_ending(client: Client, run: RunRef) -> Ending | None:
    """How ``run`` ended (None while it is open, or while Temporal cannot say: the run's own
    events are read on meanwhile). Never waits longer than ``DESCRIBE_TIMEOUT``."""
    handle = client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
    try:
        described = await handle.describe(rpc_timeout=DESCRIBE_TIMEOUT)
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            return None
        raise
    status = described.status
    if status in (None, WorkflowExecutionStatus.RUNNING):
        return None
    if status == WorkflowExecutionStatus.COMPLETED:
        return Ending(status="succeeded")
    if status == WorkflowExecutionStatus.FAILED:
        try:
            await handle.result(follow_runs=False)
        except WorkflowFailureError as exc:
            return Ending(status="failed", error=failure_text(exc))
        except Exception:
            pass
        return Ending(status="failed", error="the run failed")
    word = status.name.lower().replace("_", " ")
    return Ending(status="failed", error=f"the run was {word}")


def failure_text(exc: BaseException) -> str:
    """The innermost message of a failure chain (the typed application error's)."""
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    cause: Any = chain[-1] if len(chain) > 1 else exc
    return str(getattr(cause, "message", None) or cause)


async def follow_pages(
    log: RunEventLog,
    stack: StackRef,
    run: RunRef,
    closed: Closed,
    *,
    after: int = 0,
    wait: bool = True,
    idle_seconds: float | None = None,
    nudge: Nudge | None = None,
) -> AsyncIterator[list[RunEvent] | None]:
    """The run's events after ``after``, in order, each once, up to its ``run_complete``,
    a page (as read in one go) at a time. With ``wait`` the stream waits for new events
    until then; without, it ends with what is there (still closing a run that Temporal says
    has ended). With ``idle_seconds``, a ``None`` comes whenever nothing came for that long
    (a keep-alive for the caller). With ``nudge`` (:mod:`stackflow.state.event_bell`), a wait
    between two polls ends as soon as the run's bell rings."""
    if after > 0:
        last = await asyncio.to_thread(log.last_event, stack, run.run_id)
        if last is not None and last.type == EventType.run_complete and last.seq <= after:
            return  # resumed after the end: nothing more will come
    cursor, asked = after, time.monotonic()
    quiet_since = asked
    while True:
        if nudge is not None:
            nudge.clear()  # before the read: a ring from now on ends the wait after it
        page = await asyncio.to_thread(log.events, stack, run.run_id, after=cursor)
        for n, event in enumerate(page):
            if event.type == EventType.run_complete:
                yield page[: n + 1]
                return
        if page:
            yield page
            cursor = page[-1].seq
            quiet_since = time.monotonic()
        elif idle_seconds is not None and time.monotonic() - quiet_since >= idle_seconds:
            quiet_since = time.monotonic()
            yield None
        if len(page) == PAGE_LIMIT:
            continue
        now = time.monotonic()
        if not wait or now - asked >= CLOSED_CHECK_SECONDS:
            asked = now
            ending = await closed()
            if ending is not None:
                end = run_complete(ending.status, error=ending.error, source="temporal")
                await asyncio.to_thread(log.append_events, stack, run, [end])
                continue  # read it back: the run's own, if it wrote one meanwhile
            if not wait:
                return
        if nudge is not None:
            await nudge.wait(POLL_SECONDS)
        else:
            await asyncio.sleep(POLL_SECONDS)


async def follow(
    log: RunEventLog, stack: StackRef, run: RunRef, closed: Closed, **options: Any
) -> AsyncIterator[RunEvent | None]:
    """:func:`follow_pages` (the same options), an event at a time."""
    async for page in follow_pages(log, stack, run, closed, **options):
        if page is None:
            yield None
            continue
        for event in page:
            yield event
