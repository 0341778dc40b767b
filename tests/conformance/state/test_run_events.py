"""State conformance, RunEventLog: each run's events numbered from 1 with no gap, appends
idempotent by key and committed in ``seq`` order, reads only through the run's stack. Every
backend (SQLite and PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stackflow.core.refs import StackRef
from stackflow.model.events import EventType, NewEvent, run_complete
from stackflow.state.protocols import RunEventLog
from tests.conformance.state.common import R1, R2, STACK


@pytest.fixture
def backend(backend: Any) -> Any:
    from tests.conformance.state.common import narrow

    return narrow(backend, RunEventLog)


def started(rid: str) -> NewEvent:
    return NewEvent(type=EventType.apply_start, key=f"a/{rid}", data={"resource": {"id": rid}})


def test_events_are_numbered_in_order_and_read_after_a_seq(backend: Any) -> None:
    assert backend.events(STACK, R1.run_id) == []
    assert backend.last_event(STACK, R1.run_id) is None
    first = backend.append_events(STACK, R1, [started("a"), started("b")])
    assert [(e.seq, e.data["resource"]["id"]) for e in first] == [(1, "a"), (2, "b")]
    backend.append_events(STACK, R1, [started("c")])
    every = backend.events(STACK, R1.run_id)
    assert [e.seq for e in every] == [1, 2, 3]
    assert [e.type for e in every] == [EventType.apply_start] * 3
    assert [e.seq for e in backend.events(STACK, R1.run_id, after=1)] == [2, 3]
    assert [e.seq for e in backend.events(STACK, R1.run_id, after=1, limit=1)] == [2]
    assert backend.events(STACK, R1.run_id, after=3) == []
    last = backend.last_event(STACK, R1.run_id)
    assert last is not None and last.seq == 3 and last.data == {"resource": {"id": "c"}}
    assert every[0].wire()["seq"] == 1 and every[0].wire()["type"] == "apply_start"


def test_an_append_again_adds_nothing_and_keeps_no_gap(backend: Any) -> None:
    backend.append_events(STACK, R1, [started("a"), started("b")])
    again = backend.append_events(STACK, R1, [started("b"), started("a"), started("c")])
    assert [(e.seq, e.data["resource"]["id"]) for e in again] == [(3, "c")]
    assert backend.append_events(STACK, R1, [started("a")]) == []
    # the same key twice in one append is one event
    twice = backend.append_events(STACK, R1, [started("d"), started("d")])
    assert [e.seq for e in twice] == [4]
    assert [e.seq for e in backend.events(STACK, R1.run_id)] == [1, 2, 3, 4]


def test_run_complete_is_one_per_run_whoever_writes_it(backend: Any) -> None:
    mine = backend.append_events(STACK, R1, [run_complete("succeeded", revision=1)])
    theirs = backend.append_events(STACK, R1, [run_complete("failed", source="reader")])
    assert len(mine) == 1 and theirs == []
    (event,) = backend.events(STACK, R1.run_id)
    assert event.type == EventType.run_complete and event.data["status"] == "succeeded"


def test_runs_and_stacks_are_apart(backend: Any) -> None:
    backend.append_events(STACK, R1, [started("a")])
    backend.append_events(STACK, R2, [started("a"), started("b")])
    assert [e.seq for e in backend.events(STACK, R1.run_id)] == [1]
    assert [e.seq for e in backend.events(STACK, R2.run_id)] == [1, 2]
    other = StackRef("p", "other")
    assert backend.events(other, R1.run_id) == []
    assert backend.last_event(other, R2.run_id) is None


def test_concurrent_appends_leave_no_gap_and_a_follower_misses_nothing(backend: Any) -> None:
    """Four writers append while a reader follows with ``after``: the reader ends with every
    event exactly once, in seq order, 1..N (commit order is seq order)."""
    writers, per_writer = 4, 25
    seen: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(per_writer):
                backend.append_events(STACK, R1, [started(f"w{w}-{i}")])
        except BaseException as exc:  # reported below
            errors.append(exc)

    def follow() -> None:
        after = 0
        try:
            while True:
                finished = done.is_set()
                page = backend.events(STACK, R1.run_id, after=after)
                for event in page:
                    seen.append(event.seq)
                    after = event.seq
                if finished and not page:
                    return
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=follow)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()
    assert errors == []
    total = writers * per_writer
    assert seen == list(range(1, total + 1))
    ids = {e.data["resource"]["id"] for e in backend.events(STACK, R1.run_id, limit=total)}
    assert len(ids) == total
