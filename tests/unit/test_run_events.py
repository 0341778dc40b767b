"""The event stream's two ends on a real SQLite backend: the activity-side sink (buffered,
flushed in the background and at the end, idempotent across a retried attempt, keeping what
was reported before a failure) and the follower (in order, ends after run_complete, closes a
run Temporal says has ended, keep-alives while quiet)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackflow.activities import events as sinks
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import EventType, RunEvent, run_complete
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.event_follow import Ending, follow

STACK = StackRef("p", "w")
RUN = RunRef("stackflow/p/w", "run-1")


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[StateBackend]:
    store = open_backend(f"sqlite:///{tmp_path / 'state.db'}", migrate=True)
    yield store
    store.close()


def types(events: list[RunEvent]) -> list[str]:
    return [e.type.value for e in events]


async def test_a_sink_flushes_while_it_runs_and_at_the_end(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sinks, "FLUSH_SECONDS", 0.05)
    async with sinks.event_sink(backend, STACK, RUN) as sink:
        sink.started("a", "OnPrem", "Create")
        sink.completed("a")
        await asyncio.sleep(0.3)  # the background flush ran
        assert types(backend.events(STACK, RUN.run_id)) == ["apply_start", "apply_complete"]
        sink.started("b", "OnPrem", "Update")
    every = backend.events(STACK, RUN.run_id)
    assert types(every) == ["apply_start", "apply_complete", "apply_start"]
    done = every[1].data
    assert done["resource"] == {"id": "a", "type": "OnPrem"} and done["action"] == "Create"
    assert isinstance(done["elapsed_seconds"], float) and done["elapsed_seconds"] >= 0
    assert every[1].time >= every[0].time  # when it happened, not when it was appended


async def test_a_retried_attempt_appends_nothing_twice(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts of one activity share its scope (run and activity id): the second's
    events for the same resources are the first's."""
    monkeypatch.setattr(sinks, "activity_scope", lambda: "run-1/activity-7")
    with pytest.raises(RuntimeError):
        async with sinks.event_sink(backend, STACK, RUN) as sink:
            sink.started("a", "OnPrem", "Create")
            sink.completed("a")
            sink.started("b", "OnPrem", "Create")
            raise RuntimeError("worker lost mid-group")
    # what it reported before the failure is kept
    assert types(backend.events(STACK, RUN.run_id)) == [
        "apply_start",
        "apply_complete",
        "apply_start",
    ]
    async with sinks.event_sink(backend, STACK, RUN) as sink:
        for rid in ("a", "b"):
            sink.started(rid, "OnPrem", "Create")
            sink.completed(rid)
    every = backend.events(STACK, RUN.run_id)
    assert [e.seq for e in every] == [1, 2, 3, 4]
    assert [(e.type.value, e.data["resource"]["id"]) for e in every] == [
        ("apply_start", "a"),
        ("apply_complete", "a"),
        ("apply_start", "b"),
        ("apply_complete", "b"),
    ]


async def test_errored_names_the_resource_and_cuts_the_error(backend: StateBackend) -> None:
    async with sinks.event_sink(backend, STACK, RUN) as sink:
        sink.started("a", "Kubernetes", "Update")
        sink.errored("a", "Update", "x" * 5000, "Conflict")
        sink.errored("never-started", "Delete", "gone", "InvalidInput")
    _, failed, early = backend.events(STACK, RUN.run_id)
    assert failed.type == EventType.apply_errored and failed.data["error_type"] == "Conflict"
    assert failed.data["resource"] == {"id": "a", "type": "Kubernetes"}
    assert len(failed.data["error"]) == 1000
    assert early.data["resource"] == {"id": "never-started", "type": None}
    assert early.data["action"] == "Delete" and early.data["elapsed_seconds"] is None


async def test_follow_reads_in_order_and_ends_after_run_complete(backend: StateBackend) -> None:
    async def never() -> Ending | None:
        raise AssertionError("a run with its run_complete needs no question to Temporal")

    sinks.record_events(backend, STACK, RUN, [run_complete("succeeded", revision=3)])
    backend.append_events(STACK, RUN, [run_complete("failed")])  # one per run: ignored
    seen = [e async for e in follow(backend, STACK, RUN, never)]
    assert [e.type.value if e else None for e in seen] == ["run_complete"]
    assert seen[0] is not None and seen[0].data["status"] == "succeeded"
    assert [e async for e in follow(backend, STACK, RUN, never, after=1)] == []


async def test_follow_closes_a_run_temporal_says_has_ended(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stackflow.state.event_follow as module

    monkeypatch.setattr(module, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(module, "CLOSED_CHECK_SECONDS", 0.05)
    asked = 0

    async def closed() -> Ending | None:
        nonlocal asked
        asked += 1
        return None if asked < 3 else Ending(status="failed", error="the run was terminated")

    seen = [e async for e in follow(backend, STACK, RUN, closed, idle_seconds=0.02)]
    events = [e for e in seen if e is not None]
    assert asked == 3 and len(events) == 1
    last = events[0]
    assert last.type == EventType.run_complete and last.seq == 1
    assert last.data == {
        "status": "failed",
        "revision": None,
        "error": "the run was terminated",
        "source": "temporal",
    }
    assert None in seen  # keep-alives while it was quiet
    # a second reader gets the very same last event, without asking again
    again = [e async for e in follow(backend, STACK, RUN, closed, wait=False)]
    assert again == [last] and asked == 3


async def test_follow_without_wait_returns_what_there_is(backend: StateBackend) -> None:
    async def running() -> Ending | None:
        return None

    async with sinks.event_sink(backend, STACK, RUN) as sink:
        sink.started("a", "OnPrem", "Create")
    seen = [e async for e in follow(backend, STACK, RUN, running, wait=False)]
    assert [e.type.value for e in seen if e] == ["apply_start"]
