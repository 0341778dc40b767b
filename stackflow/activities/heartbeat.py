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
        while True:
            activity.heartbeat(detail)
            await asyncio.sleep(INTERVAL_SECONDS)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
