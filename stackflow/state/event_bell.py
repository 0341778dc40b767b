"""Wake-ups for the followers of a run's event stream.

A run's events are in the state backend, the truth, and a follower (the API's ``…/events``)
reads them by polling every :data:`~stackflow.state.event_follow.POLL_SECONDS`. With Redis
configured (``REDIS_URL``), whoever appends a run's events rings that run's bell right after
(:class:`RingingEventLog`), and a follower waiting between two polls wakes at once
(:class:`Listener`): an event reaches the stream within milliseconds of its append instead of
up to a poll later, and a CLI following a run through the API sees its end sooner.

A ring says only that the run has new events (the channel names the run id; the message is
empty): no event, nothing sensitive, goes through Redis. Redis stays a cache: a ring that is
lost (Redis down or restarted, a follower subscribed late) only means the next poll finds the
events, as without Redis. Neither side ever fails because of Redis: a publish that fails is
not tried again for :data:`RETRY_AFTER_SECONDS`, a subscription that drops is made again.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import PAGE_LIMIT, NewEvent, RunEvent
from stackflow.state.protocols import RunEventLog

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

CHANNEL = "stackflow:events:"
"""A run's channel is this prefix and its Temporal run id."""
RETRY_AFTER_SECONDS = 5.0
SOCKET_TIMEOUT = 0.5


class Bell:
    """The publishing side: :meth:`ring` after a run's events are appended (blocking, from
    a worker thread, as the append itself)."""

    def __init__(self, redis_url: str | None) -> None:
        import redis  # a worker's (the API in the CLI's process needs no bell)

        self._error = redis.RedisError
        self._client: redis.Redis | None = (
            redis.Redis.from_url(
                redis_url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
            )
            if redis_url
            else None
        )
        self._down_until = 0.0
        self._warned = False

    def ring(self, run_id: str) -> None:
        if self._client is None or time.monotonic() < self._down_until or not run_id:
            return
        try:
            self._client.publish(CHANNEL + run_id, b"")
        except self._error as exc:
            self._down_until = time.monotonic() + RETRY_AFTER_SECONDS
            if not self._warned:
                self._warned = True
                log.warning("event bell: Redis unavailable (%s); followers poll", exc)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class RingingEventLog:
    """A :class:`~stackflow.state.protocols.RunEventLog` that rings the run's bell after
    each append; reads go to the log as they are."""

    def __init__(self, log: RunEventLog, bell: Bell) -> None:
        self.log, self.bell = log, bell

    def append_events(
        self, stack: StackRef, run: RunRef, events: Sequence[NewEvent]
    ) -> builtins.list[RunEvent]:
        appended = self.log.append_events(stack, run, events)
        self.bell.ring(run.run_id)
        return appended

    def events(
        self, stack: StackRef, run_id: str, *, after: int = 0, limit: int = PAGE_LIMIT
    ) -> builtins.list[RunEvent]:
        return self.log.events(stack, run_id, after=after, limit=limit)

    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None:
        return self.log.last_event(stack, run_id)


class Nudge:
    """One follower's wake-up: cleared before each poll, set by a ring of its run."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def clear(self) -> None:
        self._event.clear()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Until the run's bell rings (since the last :meth:`clear`) or ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class Listener:
    """The following side, one per process and event loop: one pattern subscription to
    every run's channel (started by the first follower, kept while the process runs), and
    the nudges of the runs being followed."""

    def __init__(self, redis_url: str | None) -> None:
        self.redis_url = redis_url
        self._waiting: dict[str, set[Nudge]] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @contextlib.contextmanager
    def nudge(self, run_id: str) -> Iterator[Nudge | None]:
        """A nudge for ``run_id`` while the block runs (None without Redis: poll only)."""
        if not self.redis_url:
            yield None
            return
        if not self._closing and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._listen())
        nudge = Nudge()
        self._waiting.setdefault(run_id, set()).add(nudge)
        try:
            yield nudge
        finally:
            waiting = self._waiting.get(run_id)
            if waiting is not None:
                waiting.discard(nudge)
                if not waiting:
                    del self._waiting[run_id]

    def wake(self, channel: str | bytes) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        for nudge in self._waiting.get(name.removeprefix(CHANNEL), ()):
            nudge.set()

    async def _listen(self) -> None:
        import redis.asyncio as aioredis

        assert self.redis_url
        warned = False
        while not self._closing:
            client = aioredis.Redis.from_url(self.redis_url, socket_connect_timeout=SOCKET_TIMEOUT)
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.psubscribe(CHANNEL + "*")
                    async for message in pubsub.listen():
                        if message.get("type") == "pmessage":
                            self.wake(message["channel"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down or gone: followers poll meanwhile
                if self._closing:  # the client may turn the cancel into its own error
                    return
                if not warned:
                    warned = True
                    log.warning("event bell: cannot listen on Redis (%s); followers poll", exc)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(RETRY_AFTER_SECONDS)

    async def close(self) -> None:
        """Stop listening (for good: a closed listener only polls)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            # not wait_for: it would wait for a cancel the client swallowed, without end
            await asyncio.wait({self._task}, timeout=SOCKET_TIMEOUT * 2)
