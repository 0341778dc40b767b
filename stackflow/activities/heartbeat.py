"""Keeps an activity's heartbeat going while a long runtime call runs.

With a heartbeat timeout on every resource activity, a worker killed mid-call is noticed
within seconds and the activity is retried on another worker (it is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

INTERVAL_SECONDS = 3.0


@contextlib.asynccontextmanager
async def heartbeating(detail: str) -> AsyncIterator[None]:
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        # The first beat after one interval, not at once: the heartbeat timeout counts from
        # the activity's start, and most activities (a small run's preview and walk, 20 ms
        # each) end well before; a beat at once cost the Temporal server a heartbeat request
        # per activity for nothing.
        while True:
            await asyncio.sleep(INTERVAL_SECONDS)
            activity.heartbeat(detail)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
