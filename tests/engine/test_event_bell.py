"""Event stream wake-ups (stackflow.state.event_bell) against a real redis-server: a follower
waiting between two polls gets a run's new events as soon as they are appended, the ring
carries nothing but the run's id, and without Redis (none, or down) streams poll as before."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import EventType, NewEvent, RunEvent
from stackflow.state import event_follow
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.event_bell import CHANNEL, Bell, Listener, RingingEventLog
from stackflow.state.event_follow import Ending, follow

STACK = StackRef("bell", "dev")
RUN = RunRef("stackflow/bell/dev", "run-bell-1")
SLOW_POLL = 30.0
"""A poll interval no test waits for: an event seen sooner came through the bell."""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StateBackend]:
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY_FILE", raising=False)
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        yield backend
    finally:
        backend.close()


def event(n: int, type: EventType = EventType.phase) -> NewEvent:
    return NewEvent(type=type, key=f"test/{n}", data={"phase": "applying", "n": n})


async def never_closed() -> Ending | None:
    return None


async def first_events(stream: AsyncIterator[RunEvent | None], count: int) -> list[RunEvent]:
    got: list[RunEvent] = []
    async for item in stream:
        if item is not None:
            got.append(item)
        if len(got) == count:
            break
    return got


async def test_a_ring_wakes_a_follower_between_polls(
    redis_server: Any, store: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_follow, "POLL_SECONDS", SLOW_POLL)
    monkeypatch.setattr(event_follow, "CLOSED_CHECK_SECONDS", SLOW_POLL)
    bell, listener = Bell(redis_server.url), Listener(redis_server.url)
    writer = RingingEventLog(store, bell)
    try:
        with listener.nudge(RUN.run_id) as nudge:
            assert nudge is not None
            stream = follow(store, STACK, RUN, never_closed, nudge=nudge)
            reader = asyncio.ensure_future(first_events(stream, 3))
            await asyncio.sleep(0.5)  # the follower has read nothing and waits; subscribed
            began = time.monotonic()
            await asyncio.to_thread(writer.append_events, STACK, RUN, [event(1), event(2)])
            await asyncio.sleep(0.2)
            await asyncio.to_thread(writer.append_events, STACK, RUN, [event(3)])
            got = await asyncio.wait_for(reader, 10)
            took = time.monotonic() - began
        assert [e.seq for e in got] == [1, 2, 3]
        assert took < SLOW_POLL / 3, took  # woken by the rings, not by a poll
    finally:
        await listener.close()
        bell.close()


async def test_a_ring_names_the_run_and_carries_nothing_else(
    redis_server: Any, store: StateBackend
) -> None:
    sub = redis.Redis.from_url(redis_server.url).pubsub(ignore_subscribe_messages=True)
    sub.psubscribe(CHANNEL + "*")
    bell = Bell(redis_server.url)
    secret = "hunter2-not-in-any-ring"
    try:
        RingingEventLog(store, bell).append_events(
            STACK, RUN, [NewEvent(type=EventType.phase, key="k", data={"error": secret})]
        )
        message = None
        deadline = time.monotonic() + 5
        while message is None and time.monotonic() < deadline:
            message = sub.get_message(timeout=0.5)
        assert message is not None
        assert message["channel"] == (CHANNEL + RUN.run_id).encode()
        assert message["data"] == b""
        assert [e.seq for e in store.events(STACK, RUN.run_id)] == [1]  # appended all the same
    finally:
        sub.close()
        bell.close()


async def test_without_redis_streams_poll_and_writes_never_fail(
    store: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_follow, "POLL_SECONDS", 0.05)
    down = "redis://127.0.0.1:9/0"  # nothing listens there
    bell, listener = Bell(down), Listener(down)
    writer = RingingEventLog(store, bell)
    try:
        writer.append_events(STACK, RUN, [event(1)])  # the ring fails quietly
        writer.append_events(STACK, RUN, [event(2)])  # not even tried again for a while
        with listener.nudge(RUN.run_id) as nudge:
            stream = follow(store, STACK, RUN, never_closed, nudge=nudge)
            got = await asyncio.wait_for(first_events(stream, 2), 5)
            reader = asyncio.ensure_future(first_events(stream, 1))
            await asyncio.sleep(0.1)
            writer.append_events(STACK, RUN, [event(3, EventType.run_complete)])
            [last] = await asyncio.wait_for(reader, 5)  # found by a poll
        assert [e.seq for e in got] == [1, 2] and last.type == EventType.run_complete
        with Listener(None).nudge(RUN.run_id) as none:
            assert none is None  # no Redis configured: plain polling
    finally:
        await listener.close()
        bell.close()


async def test_a_ring_between_the_read_and_the_wait_is_not_lost() -> None:
    listener = Listener("redis://unused")
    with listener.nudge("r1") as nudge:
        assert nudge is not None
        nudge.clear()  # the follower is about to read
        listener.wake(CHANNEL + "r1")  # the writer rings while it reads
        began = time.monotonic()
        await nudge.wait(SLOW_POLL)  # so the wait after the read ends at once
        assert time.monotonic() - began < 1
        listener.wake(CHANNEL + "other-run")
    assert "r1" not in listener._waiting  # forgotten with its last follower
    await listener.close()


async def test_closing_ends_a_subscription_whose_client_swallowed_the_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis client may turn the cancel into an error of its own (or into nothing): the
    listener still stops, and closing it takes a bounded time (a CLI or an API shutting down
    must not wait for a subscription)."""
    listener = Listener("redis://unused")
    rounds = 0

    async def stubborn() -> None:
        nonlocal rounds
        while not listener._closing:
            rounds += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # swallowed, as a client may

    monkeypatch.setattr(listener, "_listen", stubborn)
    with listener.nudge("r1"):
        await asyncio.sleep(0.05)
    began = time.monotonic()
    await listener.close()
    assert time.monotonic() - began < 3
    await asyncio.sleep(0)
    assert listener._task is not None and listener._task.done() and rounds == 1
    with listener.nudge("r2"):
        await asyncio.sleep(0)
    assert listener._task.done()  # a closed listener starts no new subscription


async def test_closing_does_not_wait_for_a_subscription_that_never_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listener = Listener("redis://unused")
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    monkeypatch.setattr(listener, "_listen", deaf)
    with listener.nudge("r1"):
        await asyncio.sleep(0.05)
    began = time.monotonic()
    await asyncio.wait_for(listener.close(), 5)
    assert time.monotonic() - began < 3
    release.set()  # let it go (the test's loop must not keep it)
    await asyncio.sleep(0.01)
