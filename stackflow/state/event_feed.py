"""The followers of one run's event stream in one process share one reader of it.

A :class:`Feed` reads the run's events from the state backend with
:func:`~stackflow.state.event_follow.follow_pages` (the poll, the bell's wake-ups, Temporal's
word on a run that closed without its ``run_complete``) once for all its followers, encodes
each event's line once, and keeps the last :data:`TAIL` of them. A follower takes what came
after its own cursor from that tail; one that is further behind (a resume with an old
``?after=``, a slow client) reads its own pages from the state backend, the truth, until it
is within the tail. So each event still reaches each follower once and in order, whatever
its cursor, and a run's followers cost one read and one wake-up per page instead of one each.

The feed starts with its first follower and stops when its last one leaves, or after the
run's ``run_complete``; a read that fails ends the feed with the error, raised to each of its
followers as it would have been to one reading alone.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import PAGE_LIMIT, EventType, RunEvent
from stackflow.state.event_bell import Listener
from stackflow.state.event_follow import Closed, follow_pages
from stackflow.state.protocols import RunEventLog

TAIL = 2 * PAGE_LIMIT
"""Events a feed keeps for its followers (each line once, whoever reads it)."""
END = EventType.run_complete.value


@dataclass(frozen=True, slots=True)
class Line:
    """An event as a stream sends it: its seq, its type and its JSON line."""

    seq: int
    type: str
    text: str

    @classmethod
    def of(cls, event: RunEvent) -> Line:
        return cls(event.seq, event.type.value, event.line())


def through_end(lines: list[Line]) -> tuple[list[Line], bool]:
    """``lines`` up to and with a ``run_complete``, and whether one was there."""
    for n, line in enumerate(lines):
        if line.type == END:
            return lines[: n + 1], True
    return lines, False


class Feed:
    """One run's events as read for its followers in this process."""

    def __init__(self, log: RunEventLog, stack: StackRef, run: RunRef, after: int) -> None:
        self.log, self.stack, self.run = log, stack, run
        self.lines: list[Line] = []
        """The last events read (at most TAIL), in seq order."""
        self.floor = after
        """Every event after ``floor`` that the feed has read is in ``lines``."""
        self.ended = False
        self.error: BaseException | None = None
        self.followers = 0
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def _ring(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def read(self, closed: Closed, listener: Listener) -> None:
        """Read the run's events to its end, keeping the tail and waking the followers."""
        try:
            with listener.nudge(self.run.run_id) as nudge:
                pages = follow_pages(
                    self.log, self.stack, self.run, closed, after=self.floor, nudge=nudge
                )
                async for page in pages:
                    if not page:
                        continue
                    self.lines += [Line.of(e) for e in page]
                    if len(self.lines) > TAIL:
                        drop = len(self.lines) - TAIL
                        self.floor = self.lines[drop - 1].seq
                        del self.lines[:drop]
                    self._ring()
        except Exception as exc:
            self.error = exc
        finally:
            self.ended = True
            self._ring()

    async def follow(
        self, after: int, idle_seconds: float | None = None
    ) -> AsyncIterator[list[Line] | None]:
        """The run's events after ``after`` up to its ``run_complete``, a page at a time;
        ``None`` after each ``idle_seconds`` without one (a keep-alive)."""
        cursor, quiet = after, time.monotonic()
        while True:
            if cursor < self.floor:  # behind the tail: its own reads, from the log
                page = await asyncio.to_thread(
                    self.log.events, self.stack, self.run.run_id, after=cursor
                )
                found, done = through_end([Line.of(e) for e in page])
                if found:
                    yield found
                    cursor, quiet = found[-1].seq, time.monotonic()
                if done:
                    return
                if page:
                    continue
            changed = self._changed
            new = self.lines[bisect.bisect_right(self.lines, cursor, key=lambda x: x.seq) :]
            if new:
                found, done = through_end(new)
                yield found
                if done:
                    return
                cursor, quiet = found[-1].seq, time.monotonic()
                continue
            if self.ended:
                if self.error is not None:
                    raise self.error
                return
            wait = None if idle_seconds is None else idle_seconds - (time.monotonic() - quiet)
            try:
                await asyncio.wait_for(changed.wait(), wait)
            except TimeoutError:
                quiet = time.monotonic()
                yield None


class Feeds:
    """The feeds of the runs this process's streams follow (the event loop's own: no lock)."""

    def __init__(self) -> None:
        self.running: dict[str, Feed] = {}

    @contextlib.contextmanager
    def follower(
        self,
        log: RunEventLog,
        listener: Listener,
        stack: StackRef,
        run: RunRef,
        closed: Closed,
        after: int,
    ) -> Iterator[Feed]:
        """The run's feed (started by its first follower from ``after``) while the block
        runs; the last follower to leave stops it."""
        feed = self.running.get(run.run_id)
        if feed is None or feed.ended:
            feed = Feed(log, stack, run, after)
            self.running[run.run_id] = feed
            feed.task = asyncio.get_running_loop().create_task(feed.read(closed, listener))
            feed.task.add_done_callback(lambda _: self._forget(feed))
        feed.followers += 1
        try:
            yield feed
        finally:
            feed.followers -= 1
            if feed.followers == 0 and feed.task is not None:
                feed.task.cancel()
                self._forget(feed)

    def _forget(self, feed: Feed) -> None:
        if self.running.get(feed.run.run_id) is feed:
            del self.running[feed.run.run_id]
