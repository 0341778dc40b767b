"""Releases over every backend: the stack lock, revisions, fenced writes, phases, unlock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stackflow.core.errors import FencedError, NotFoundError, PhaseConflictError, StackLockedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Approval, Decision, Operation, Phase, Release, State
from stackflow.model.spec import Resource, ResourceType, Spec
from stackflow.state.backend import StateBackend

P, W = "proj", "dev"
STACK = StackRef(P, W)
R1 = RunRef("apply-proj-dev", "run-1")
R2 = RunRef("apply-proj-dev", "run-2")
OTHER = RunRef("destroy-proj-dev", "run-9")


def res(rid: str, **attrs: object) -> Resource:
    return Resource(id=rid, type=ResourceType.OnPrem, attributes=dict(attrs))


def spec(*ids: str) -> Spec:
    return Spec(resources=[res(i) for i in ids])


def finish(backend: StateBackend, release: Release, run: RunRef, *resources: Resource) -> Release:
    backend.set_phase(STACK, release.revision, Phase.applying, run=run)
    for r in resources:
        backend.record_resource(STACK, release.revision, r, run=run)
    return backend.set_phase(STACK, release.revision, Phase.succeeded, run=run)


def test_first_release(backend: StateBackend) -> None:
    assert backend.latest(STACK) is None
    assert backend.latest_succeeded(STACK) is None
    r = backend.create(STACK, Operation.apply, spec("a"), run=R1)
    assert (r.revision, r.phase, r.operation) == (1, Phase.generating, Operation.apply)
    assert r.state.resources == [] and r.error is None and r.approval is None and r.changes is None
    assert (r.workflow_id, r.run_id) == (R1.workflow_id, R1.run_id)
    assert r.spec == spec("a") and r.spec_ref is not None
    assert backend.get(STACK, 1) == r
    assert backend.latest(STACK) == r
    lock = backend.lock(STACK)
    assert lock is not None and lock.revision == 1 and lock.holder() == R1


def test_stack_lock_names_release_and_unlock_command(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    backend.set_phase(STACK, 1, Phase.applying, run=R1)
    with pytest.raises(StackLockedError) as info:
        backend.create(STACK, Operation.destroy, None, run=OTHER)
    message = str(info.value)
    assert "release 1 (apply)" in message and str(R1) in message
    assert "stackflow release unlock --project proj --workspace dev" in message
    assert info.value.exit_code == 3
    # the refused create wrote nothing, and the holder is unchanged
    assert backend.revisions(STACK) == [1]
    assert backend.lock(STACK).holder() == R1  # type: ignore[union-attr]
    # the same run cannot open a second release either: one release in progress per stack
    with pytest.raises(StackLockedError):
        backend.create(STACK, Operation.apply, spec("a"), run=R1)
    # another stack is independent
    assert backend.create(StackRef(P, "prod"), Operation.apply, spec("a"), run=OTHER).revision == 1


def test_unlock(backend: StateBackend) -> None:
    with pytest.raises(NotFoundError):
        backend.unlock(STACK)
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    unlocked = backend.unlock(STACK)
    assert unlocked.phase is Phase.failed and "unlocked" in (unlocked.error or "")
    assert backend.lock(STACK) is None
    assert backend.unlock(STACK) == unlocked  # nothing to unlock: unchanged
    # the run that held the stack can no longer write to it
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("a"), run=R1)
    with pytest.raises(PhaseConflictError):
        backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    assert backend.get(STACK, 1).state.resources == []
    assert backend.create(STACK, Operation.apply, spec("a"), run=R2).revision == 2


def test_unlock_with_reason(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    assert backend.unlock(STACK, "the run was terminated").error == "the run was terminated"


def test_resource_state_is_written_in_place(backend: StateBackend) -> None:
    r = backend.create(STACK, Operation.apply, spec("a", "b", "c"), run=R1)
    backend.set_phase(STACK, 1, Phase.applying, run=R1)
    backend.record_resource(STACK, 1, res("a", v=1), run=R1)
    backend.record_resource(STACK, 1, res("b", v=1), run=R1)
    backend.record_resource(STACK, 1, res("a", v=2), run=R1)  # a later write wins, in place
    backend.record_resource(STACK, 1, res("a", v=2), run=R1)  # idempotent
    backend.record_resource(STACK, 1, res("c", v=1), run=R1)
    backend.record_deletion(STACK, 1, "c", run=R1)
    backend.record_deletion(STACK, 1, "c", run=R1)  # idempotent
    during = backend.get(STACK, r.revision)
    assert during.phase is Phase.applying
    assert [(x.id, x.attributes) for x in during.state.resources] == [
        ("a", {"v": 2}),
        ("b", {"v": 1}),
    ]
    assert backend.resource_state(STACK, 1, "a") == res("a", v=2)
    assert backend.resource_state(STACK, 1, "c") is None
    assert backend.resource_state(STACK, 1, "zzz") is None
    assert backend.resources(STACK, 1, ["b", "zzz", "b"]) == {"b": res("b", v=1)}
    done = backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    assert done.resource_count == 2
    assert backend.get(STACK, 1).state == during.state
    assert backend.resource_state(STACK, 1, "b") == res("b", v=1)


def test_next_release_continues_from_latest_state_even_failed(backend: StateBackend) -> None:
    first = backend.create(STACK, Operation.apply, spec("a", "b"), run=R1)
    finish(backend, first, R1, res("a"), res("b"))
    second = backend.create(STACK, Operation.apply, spec("a", "b", "c"), run=R2)
    assert [x.id for x in second.state.resources] == ["a", "b"]
    backend.set_phase(STACK, 2, Phase.applying, run=R2)
    backend.record_resource(STACK, 2, res("c"), run=R2)
    backend.set_phase(STACK, 2, Phase.failed, run=R2, error="boom")
    assert backend.phase_of(STACK, 2) is Phase.failed
    assert backend.get(STACK, 2).error == "boom"
    latest_ok = backend.latest_succeeded(STACK)
    assert latest_ok is not None and latest_ok.revision == 1
    assert [x.id for x in latest_ok.state.resources] == ["a", "b"]
    assert backend.latest_succeeded_revision(STACK) == 1
    third = backend.create(STACK, Operation.apply, spec("a", "b", "c"), run=OTHER)
    assert [x.id for x in third.state.resources] == ["a", "b", "c"]  # partial state carried over
    # the copy is the new release's own: writing it leaves the earlier ones as they were
    backend.record_deletion(STACK, 3, "a", run=OTHER)
    assert [x.id for x in backend.get(STACK, 2).state.resources] == ["a", "b", "c"]
    assert [x.id for x in backend.get(STACK, 1).state.resources] == ["a", "b"]


def test_set_phase_fields_and_final_rules(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    approval = Approval(decision=Decision.approved, by="alice", at=datetime.now(UTC), reason="ok")
    changes = {"changes": [], "summary": {"Create": 0, "Update": 0, "Delete": 0, "UnChanged": 0}}
    r = backend.set_phase(STACK, 1, Phase.previewing, run=R1, changes=changes, approval=approval)
    assert r.phase is Phase.previewing and r.changes == changes and r.approval == approval
    assert r.modified_at >= r.created_at
    stored = backend.get(STACK, 1)
    assert stored.changes == changes and stored.approval == approval
    done = backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    assert done.changes == changes  # fields not given are kept
    # a retried activity: the same final phase again is a no-op, even once the lock is gone
    assert backend.set_phase(STACK, 1, Phase.succeeded, run=R1) == done
    with pytest.raises(PhaseConflictError):
        backend.set_phase(STACK, 1, Phase.applying, run=R1)
    with pytest.raises(PhaseConflictError):
        backend.set_phase(STACK, 1, Phase.failed, run=R1)
    assert backend.phase_of(STACK, 1) is Phase.succeeded
    with pytest.raises(NotFoundError):
        backend.set_phase(STACK, 9, Phase.failed, run=R1)
    with pytest.raises(NotFoundError):
        backend.phase_of(STACK, 9)
    assert Phase.succeeded.is_final and Phase.failed.is_final and not Phase.destroying.is_final


def test_writes_are_fenced_by_the_run_holding_the_stack(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    backend.record_resource(STACK, 1, res("a", v=1), run=R1)
    for intruder in (R2, OTHER, None):
        with pytest.raises(FencedError):
            backend.set_phase(STACK, 1, Phase.failed, run=intruder)
        with pytest.raises(FencedError):
            backend.record_resource(STACK, 1, res("a", v=666), run=intruder)
        with pytest.raises(FencedError):
            backend.record_deletion(STACK, 1, "a", run=intruder)
        with pytest.raises(FencedError):
            backend.assert_holds(STACK, 1, intruder)
    # nothing of it was written
    after = backend.get(STACK, 1)
    assert after.phase is Phase.generating and after.state.resources == [res("a", v=1)]
    assert backend.lock(STACK).holder() == R1  # type: ignore[union-attr]
    # the holder writes only its own revision
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 2, res("b"), run=R1)
    backend.assert_holds(STACK, 1, R1)
    # a final phase frees the stack: from then on the run's writes are refused too
    backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("a", v=2), run=R1)
    assert backend.get(STACK, 1).state.resources == [res("a", v=1)]


def test_a_lock_taken_without_a_run_admits_only_writers_without_one(
    backend: StateBackend,
) -> None:
    backend.create(STACK, Operation.apply, spec("a"))
    lock = backend.lock(STACK)
    assert lock is not None and lock.holder() is None and lock.held_by(None)
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("a"), run=R1)
    backend.record_resource(STACK, 1, res("a"))
    assert backend.set_phase(STACK, 1, Phase.succeeded).resource_count == 1


def test_recover_is_compare_and_set_on_the_lock(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    stale = backend.lock(STACK)
    assert stale is not None
    assert backend.recover(stale, "run-1 was terminated")
    assert backend.lock(STACK) is None
    failed = backend.get(STACK, 1)
    assert failed.phase is Phase.failed and failed.error == "run-1 was terminated"
    backend.create(STACK, Operation.apply, spec("a"), run=R2)
    # the same stale view of the lock no longer matches: the new holder keeps the stack
    assert not backend.recover(stale, "late")
    assert backend.lock(STACK).holder() == R2  # type: ignore[union-attr]
    assert backend.phase_of(STACK, 2) is Phase.generating


def test_transfer_hands_the_stack_to_the_new_run(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, spec("a"), run=R1)
    held = backend.lock(STACK)
    assert held is not None
    assert backend.transfer(held, R2)
    assert backend.lock(STACK).holder() == R2  # type: ignore[union-attr]
    moved = backend.get(STACK, 1)
    assert (moved.workflow_id, moved.run_id) == (R2.workflow_id, R2.run_id)
    with pytest.raises(FencedError):
        backend.record_resource(STACK, 1, res("a"), run=R1)
    backend.record_resource(STACK, 1, res("a"), run=R2)
    assert not backend.transfer(held, OTHER)  # stale: R2 holds it now
    assert backend.lock(STACK).holder() == R2  # type: ignore[union-attr]


def test_list_by_revision(backend: StateBackend) -> None:
    for i in range(11):
        run = RunRef("wf", f"run-{i}")
        r = backend.create(STACK, Operation.apply, spec("a"), run=run)
        if i == 0:
            backend.record_resource(STACK, r.revision, res("a"), run=run)
        backend.set_phase(STACK, r.revision, Phase.succeeded, run=run)
    listed = backend.list(STACK)
    assert [r.revision for r in listed] == list(range(1, 12))
    # listings carry counts, not states or specs
    assert {r.resource_count for r in listed} == {1}
    assert all(r.state.resources == [] and r.spec is None for r in listed)
    with_state = backend.list(STACK, with_state=True)
    assert all(r.state.resources == [res("a")] for r in with_state)
    assert backend.revisions(STACK) == list(range(1, 12))
    assert backend.latest(STACK).revision == 11  # type: ignore[union-attr]
    assert backend.latest_succeeded_revision(STACK) == 11
    assert backend.stacks() == [STACK]


def test_destroy_release_has_no_spec(backend: StateBackend) -> None:
    first = backend.create(STACK, Operation.apply, spec("a"), run=R1)
    finish(backend, first, R1, res("a"))
    d = backend.create(STACK, Operation.destroy, None, run=R2)
    assert d.operation is Operation.destroy and d.spec is None and d.spec_ref is None
    assert [x.id for x in d.state.resources] == ["a"]
    # destroy finds the spec (for its context) in the latest release that has one
    assert backend.latest_spec_ref(STACK) == first.spec_ref
    backend.set_phase(STACK, 2, Phase.destroying, run=R2)
    backend.record_deletion(STACK, 2, "a", run=R2)
    assert backend.set_phase(STACK, 2, Phase.succeeded, run=R2).resource_count == 0
    assert backend.get(STACK, 2).state.resources == []
    assert backend.latest_succeeded(STACK).operation is Operation.destroy  # type: ignore[union-attr]


def test_import_release_in_progress_locks_without_a_run(backend: StateBackend) -> None:
    stamp = datetime(2024, 5, 10, 8, 48, tzinfo=UTC)
    old = Release(
        project=P,
        workspace=W,
        revision=4,
        phase=Phase.applying,
        spec=spec("a"),
        state=State(resources=[res("a", v=1)]),
        created_at=stamp,
        modified_at=stamp,
    )
    backend.import_release(old)
    got = backend.get(STACK, 4)
    assert got.phase is Phase.applying and got.spec == spec("a")
    assert got.state.resources == [res("a", v=1)] and got.created_at == stamp
    lock = backend.lock(STACK)
    assert lock is not None and lock.revision == 4 and lock.holder() is None
    with pytest.raises(StackLockedError):
        backend.create(STACK, Operation.apply, spec("a"), run=R1)
    assert backend.unlock(STACK).phase is Phase.failed
    nxt = backend.create(STACK, Operation.apply, spec("a"), run=R1)
    assert nxt.revision == 5 and nxt.state.resources == [res("a", v=1)]
