"""Calls made in the same turn of the event loop, run together as one batch in one thread.

A runtime whose calls are cheap but each wait on the disk (OnPrem) answers many concurrent
calls with one thread hop and one wait per batch instead of one per call. Calls that arrive
while a batch runs form the next one; a batch holds at most ``limit`` calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

J = TypeVar("J")


class TurnBatcher(Generic[J]):
    """Jobs submitted in one turn of a loop go to ``run`` together, in a worker thread;
    ``run`` leaves each job's outcome on the job."""

    def __init__(self, run: Callable[[list[J]], None], limit: int) -> None:
        self._run = run
        self._limit = limit
        self._open: dict[asyncio.AbstractEventLoop, tuple[list[J], asyncio.Future[None]]] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, job: J) -> None:
        """Returns once the batch holding ``job`` has run (raises what ``run`` raised)."""
        loop = asyncio.get_running_loop()
        batch = self._open.get(loop)
        if batch is None or len(batch[0]) >= self._limit:
            batch = ([], loop.create_future())
            # the outcome counts as seen even when every caller was cancelled meanwhile
            batch[1].add_done_callback(lambda f: f.cancelled() or f.exception())
            self._open[loop] = batch
            loop.call_soon(self._start, loop, batch)
        batch[0].append(job)
        # a caller that is cancelled leaves the others' batch running
        await asyncio.shield(batch[1])

    def _start(
        self, loop: asyncio.AbstractEventLoop, batch: tuple[list[J], asyncio.Future[None]]
    ) -> None:
        if self._open.get(loop) is batch:
            del self._open[loop]
        jobs, done = batch
        task = loop.create_task(asyncio.to_thread(self._run, jobs))
        self._running.add(task)

        def finished(task: asyncio.Task[None]) -> None:
            self._running.discard(task)
            if done.done():
                return
            if task.cancelled():
                done.cancel()
            elif (error := task.exception()) is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        task.add_done_callback(finished)
