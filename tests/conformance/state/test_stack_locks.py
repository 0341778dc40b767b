"""State conformance, StackLocks: the run-owned stack lock, fencing, recovery, transfer, unlock.
Every backend (SQLite and PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from stackflow.core.errors import (
    FencedError,
    PhaseConflictError,
    StackLockedError,
)
from stackflow.core.refs import RunRef
from stackflow.engine.spec import parse_spec
from stackflow.model.release import Operation, Phase
from stackflow.state.backend import StackLock, StateBackend
from stackflow.state.protocols import ReleaseReader, ReleaseWriter, StackLocks
from tests.conformance.state.common import R1, R2, STACK, narrow, res


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, StackLocks, ReleaseWriter, ReleaseReader)


def test_first_release_takes_the_lock_and_final_phase_frees_it(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {"x": 1}}]})
    release = backend.create(STACK, Operation.apply, spec, run=R1)
    assert (release.revision, release.phase) == (1, Phase.generating)
    lock = backend.lock(STACK)
    assert lock is not None and lock.revision == 1 and lock.held_by(R1)
    assert not lock.held_by(R2)
    stored = backend.get(STACK, 1)
    assert stored.spec == spec and stored.run_id == R1.run_id and stored.spec_ref
    backend.set_phase(STACK, 1, Phase.applying, run=R1)
    assert backend.lock(STACK) is not None
    done = backend.set_phase(STACK, 1, Phase.succeeded, run=R1, changes={"n": 1})
    assert done.phase is Phase.succeeded and backend.lock(STACK) is None
    assert backend.get(STACK, 1).changes == {"n": 1}


def test_second_run_is_refused_while_the_first_holds_the_stack(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    with pytest.raises(StackLockedError, match=r"release 1 \(apply\) held by run run-1"):
        backend.create(STACK, Operation.apply, run=R2)
    assert backend.revisions(STACK) == [1]


def test_writes_from_a_run_that_does_not_hold_the_stack_are_refused(
    backend: StateBackend,
) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    backend.record_resource(STACK, 1, res("a", v=1), run=R1)
    with pytest.raises(FencedError, match="run-2"):
        backend.record_resource(STACK, 1, res("a", v=666), run=R2)
    with pytest.raises(FencedError):
        backend.record_deletion(STACK, 1, "a", run=R2)
    with pytest.raises(FencedError):
        backend.set_phase(STACK, 1, Phase.succeeded, run=R2)
    with pytest.raises(FencedError):
        backend.assert_holds(STACK, 1, R2)
    backend.assert_holds(STACK, 1, R1)
    assert backend.resource_state(STACK, 1, "a") == res("a", v=1)
    assert backend.phase_of(STACK, 1) is Phase.generating


def test_forced_unlock_fences_the_old_run_out(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    backend.record_resource(STACK, 1, res("a"), run=R1)
    after = backend.unlock(STACK)
    assert after.phase is Phase.failed and "unlocked by hand" in (after.error or "")
    assert backend.lock(STACK) is None
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("late"), run=R1)
    with pytest.raises(PhaseConflictError):
        backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    # the next release starts from what release 1 recorded, without the refused write
    nxt = backend.create(STACK, Operation.destroy, run=R2)
    assert [r.id for r in nxt.state.resources] == ["a"]
    with pytest.raises(FencedError):  # an old run never writes into a newer release either
        backend.record_resource(STACK, 2, res("late"), run=R1)


def test_recover_and_transfer_are_compare_and_set(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    lock = backend.lock(STACK)
    assert lock is not None
    stale = lock.model_copy(update={"run_id": "someone-else"})
    assert not backend.recover(stale, "nope") and backend.lock(STACK) == lock
    assert backend.transfer(lock, R2)
    assert not backend.transfer(lock, R2)  # the lock moved on
    backend.record_resource(STACK, 1, res("a"), run=R2)
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("b"), run=R1)
    moved = backend.lock(STACK)
    assert moved is not None and backend.recover(moved, "run-2 was terminated")
    closed = backend.get(STACK, 1)
    assert closed.phase is Phase.failed and closed.error == "run-2 was terminated"
    assert closed.run_id == "run-2" and backend.lock(STACK) is None


def test_concurrent_creates_give_one_lock_and_parallel_writes_all_land(
    backend: StateBackend,
) -> None:
    barrier = threading.Barrier(8)

    def attempt(n: int) -> int | None:
        barrier.wait()
        try:
            return backend.create(STACK, Operation.apply, run=RunRef("wf", f"r{n}")).revision
        except StackLockedError:
            return None

    with ThreadPoolExecutor(8) as pool:
        won = [r for r in pool.map(attempt, range(8)) if r is not None]
    assert won == [1]
    lock = backend.lock(STACK)
    assert lock is not None
    holder = lock.holder()
    assert holder is not None
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: backend.record_resource(STACK, 1, res(f"n{i}", i=i), run=holder),
                range(200),
            )
        )
    state = backend.resources(STACK, 1)
    assert len(state) == 200 and state["n7"].attributes == {"i": 7}


def test_stack_lock_model_describes_its_holder() -> None:
    lock = StackLock.model_validate(
        {
            "project": "p",
            "workspace": "w",
            "revision": 2,
            "operation": "destroy",
            "workflow_id": "wf",
            "run_id": "r",
            "acquired_at": "2026-01-01T00:00:00Z",
        }
    )
    assert lock.describe() == "release 2 (destroy) held by run r of workflow wf"
