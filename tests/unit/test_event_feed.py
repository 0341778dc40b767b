"""A run's followers in one process share one reader of its events (stackflow.state.event_feed),
on a real SQLite event log: each follower gets every event after its cursor once, in order,
whether it is within the shared tail, behind it (its own reads) or ahead of the reader; the
log is read about once per poll for all of them; a failed read reaches every follower; the
last follower to leave stops the reader."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterator
from pathlib import Path

import pytest

import stackflow.state.event_feed as feeds_module
import stackflow.state.event_follow as follow_module
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import EventType, NewEvent, RunEvent, run_complete
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.event_bell import Listener
from stackflow.state.event_feed import Feeds

STACK = StackRef("p", "w")
RUN = RunRef("stackflow/p/w", "run-feed")
EVENTS = 40


class Counted:
    """The real event log, its reads counted."""

    def __init__(self, log: StateBackend) -> None:
        self.log, self.reads, self.fail = log, 0, False

    def append_events(
        self, stack: StackRef, run: RunRef, events: list[NewEvent]
    ) -> builtins.list[RunEvent]:
        return self.log.append_events(stack, run, events)

    def events(
        self, stack: StackRef, run_id: str, *, after: int = 0, limit: int = 500
    ) -> list[RunEvent]:
        self.reads += 1
        if self.fail:
            raise OSError("the state backend went away")
        return self.log.events(stack, run_id, after=after, limit=limit)

    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None:
        return self.log.last_event(stack, run_id)


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    monkeypatch.setattr(follow_module, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(feeds_module, "TAIL", 5)
    store = open_backend(f"sqlite:///{tmp_path / 'state.db'}", migrate=True)
    yield Counted(store)
    store.close()


def phase(n: int) -> NewEvent:
    return NewEvent(type=EventType.phase, key=f"phase-{n}", data={"phase": f"p{n}"})


async def running() -> None:
    return None


async def test_followers_share_reads_and_each_gets_every_event_once(log: Counted) -> None:
    feeds = Feeds()
    listener = Listener(None)

    async def follower(after: int, start: float, stop_after: int | None = None) -> list[int]:
        await asyncio.sleep(start)
        seen: list[int] = []
        with feeds.follower(log, listener, STACK, RUN, running, after) as feed:
            async for lines in feed.follow(after):
                assert lines is not None
                seen += [line.seq for line in lines]
                if stop_after is not None and seen[-1] >= stop_after:
                    break
        if stop_after is not None:  # disconnect once, resume after the last seq seen
            return seen + await follower(seen[-1], 0.05)
        return seen

    async def writer() -> None:
        for n in range(EVENTS):
            log.append_events(STACK, RUN, [phase(n)])
            await asyncio.sleep(0.01)
        log.append_events(STACK, RUN, [run_complete("succeeded")])

    starts = [(0, 0.0, None)] * 10 + [(0, 0.3, None)] * 5 + [(7, 0.1, None)] * 5
    starts += [(0, 0.0, 12)] * 10  # these disconnect once and resume with ?after=
    results = await asyncio.gather(writer(), *(follower(*s) for s in starts))
    every = list(range(1, EVENTS + 2))
    for (after, _, _), seen in zip(starts, results[1:], strict=True):
        assert seen == every[after:]
    # one reader's polls (about one per event written) and the late followers' own reads,
    # not one poll per follower (30 followers would be some 1,500 reads)
    assert log.reads < 4 * EVENTS, log.reads
    assert feeds.running == {}


async def test_a_failed_read_reaches_every_follower_and_the_last_to_leave_stops_it(
    log: Counted,
) -> None:
    feeds = Feeds()
    listener = Listener(None)
    log.append_events(STACK, RUN, [phase(0)])

    async def follower() -> list[int]:
        seen: list[int] = []
        with feeds.follower(log, listener, STACK, RUN, running, 0) as feed:
            async for lines in feed.follow(0):
                assert lines is not None
                seen += [line.seq for line in lines]
                log.fail = True
        return seen

    results = await asyncio.gather(follower(), follower(), return_exceptions=True)
    assert [str(r) for r in results] == ["the state backend went away"] * 2
    assert feeds.running == {}

    # a follower that leaves early stops the reader with it
    log.fail = False
    with feeds.follower(log, listener, STACK, RUN, running, 0) as feed:
        assert feeds.running == {RUN.run_id: feed}
        async for lines in feed.follow(0, idle_seconds=0.02):
            assert lines is not None and [line.seq for line in lines] == [1]
            break
    await asyncio.sleep(0)
    assert feeds.running == {} and feed.task is not None
    await asyncio.wait({feed.task}, timeout=1)
    assert feed.task.cancelled()
