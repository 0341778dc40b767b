"""Releases over every backend: lock, revisions, journal, phases, unlock."""

from __future__ import annotations

import pytest

from stackflow.errors import NotFoundError, OwnerConflictError, PhaseConflictError, StackLockedError
from stackflow.release import Operation, Phase, Release, ReleaseStore
from stackflow.spec import Resource, ResourceType, Spec

P, W = "proj", "dev"


def res(rid: str, **attrs: object) -> Resource:
    return Resource(id=rid, type=ResourceType.OnPrem, attributes=dict(attrs))


def spec(*ids: str) -> Spec:
    return Spec(resources=[res(i) for i in ids])


def finish(store: ReleaseStore, release: Release, *resources: Resource) -> Release:
    store.set_phase(P, W, release.revision, Phase.applying)
    for r in resources:
        store.record_resource(P, W, release.revision, r)
    return store.set_phase(P, W, release.revision, Phase.succeeded)


def test_first_release(release_store: ReleaseStore) -> None:
    assert release_store.latest(P, W) is None
    assert release_store.latest_succeeded(P, W) is None
    r = release_store.create(P, W, Operation.apply, spec("a"))
    assert (r.revision, r.phase, r.operation) == (1, Phase.generating, Operation.apply)
    assert r.state.resources == [] and r.error is None and r.approval is None and r.changes is None
    assert release_store.get(P, W, 1) == r
    assert release_store.latest(P, W) == r


def test_stack_lock_names_release_and_unlock_command(release_store: ReleaseStore) -> None:
    release_store.create(P, W, Operation.apply, spec("a"))
    release_store.set_phase(P, W, 1, Phase.applying)
    with pytest.raises(StackLockedError) as info:
        release_store.create(P, W, Operation.destroy, None)
    message = str(info.value)
    assert "release 1" in message and "applying" in message
    assert "stackflow release unlock --project proj --workspace dev" in message
    assert info.value.exit_code == 3
    # another stack is independent
    assert release_store.create(P, "prod", Operation.apply, spec("a")).revision == 1


def test_unlock(release_store: ReleaseStore) -> None:
    with pytest.raises(NotFoundError):
        release_store.unlock(P, W)
    release_store.create(P, W, Operation.apply, spec("a"))
    unlocked = release_store.unlock(P, W)
    assert unlocked.phase is Phase.failed and "unlocked" in (unlocked.error or "")
    assert release_store.unlock(P, W) == unlocked  # nothing to unlock: unchanged
    assert release_store.create(P, W, Operation.apply, spec("a")).revision == 2


def test_state_is_journaled_then_folded(release_store: ReleaseStore) -> None:
    r = release_store.create(P, W, Operation.apply, spec("a", "b", "c"))
    release_store.set_phase(P, W, 1, Phase.applying)
    release_store.record_resource(P, W, 1, res("a", v=1))
    release_store.record_resource(P, W, 1, res("b", v=1))
    release_store.record_resource(P, W, 1, res("a", v=2))  # a later write wins, in place
    release_store.record_resource(P, W, 1, res("a", v=2))  # idempotent
    release_store.record_resource(P, W, 1, res("c", v=1))
    release_store.record_deletion(P, W, 1, "c")
    release_store.record_deletion(P, W, 1, "c")  # idempotent
    during = release_store.get(P, W, r.revision)
    assert during.phase is Phase.applying
    assert [(x.id, x.attributes) for x in during.state.resources] == [
        ("a", {"v": 2}),
        ("b", {"v": 1}),
    ]
    assert release_store.resource_state(P, W, 1, "a") == res("a", v=2)
    assert release_store.resource_state(P, W, 1, "c") is None
    assert release_store.resource_state(P, W, 1, "zzz") is None
    done = release_store.set_phase(P, W, 1, Phase.succeeded)
    assert done.state == during.state
    assert release_store.store.read_journal("Release", "proj/dev", "1") == []
    assert release_store.get(P, W, 1).state == during.state
    assert release_store.resource_state(P, W, 1, "b") == res("b", v=1)  # from the file now


def test_next_release_continues_from_latest_state_even_failed(release_store: ReleaseStore) -> None:
    first = release_store.create(P, W, Operation.apply, spec("a", "b"))
    finish(release_store, first, res("a"), res("b"))
    second = release_store.create(P, W, Operation.apply, spec("a", "b", "c"))
    assert [x.id for x in second.state.resources] == ["a", "b"]
    release_store.set_phase(P, W, 2, Phase.applying)
    release_store.record_resource(P, W, 2, res("c"))
    release_store.set_phase(P, W, 2, Phase.failed, error="boom")
    assert release_store.latest_succeeded(P, W) is not None
    assert release_store.latest_succeeded_revision(P, W) == 1
    third = release_store.create(P, W, Operation.apply, spec("a", "b", "c"))
    assert [x.id for x in third.state.resources] == ["a", "b", "c"]  # partial state carried over


def test_set_phase_fields_and_final_rules(release_store: ReleaseStore) -> None:
    from datetime import UTC, datetime

    from stackflow.release import Approval, Decision

    release_store.create(P, W, Operation.apply, spec("a"))
    approval = Approval(decision=Decision.approved, by="alice", at=datetime.now(UTC), reason="ok")
    changes = {"changes": [], "summary": {"Create": 0, "Update": 0, "Delete": 0, "UnChanged": 0}}
    r = release_store.set_phase(P, W, 1, Phase.previewing, changes=changes, approval=approval)
    assert r.changes == changes and r.approval == approval
    assert r.modified_at >= r.created_at
    done = release_store.set_phase(P, W, 1, Phase.succeeded)
    assert release_store.set_phase(P, W, 1, Phase.succeeded) == done  # retried activity: no-op
    with pytest.raises(PhaseConflictError):
        release_store.set_phase(P, W, 1, Phase.applying)
    with pytest.raises(PhaseConflictError):
        release_store.set_phase(P, W, 1, Phase.failed)
    assert Phase.succeeded.is_final and Phase.failed.is_final and not Phase.destroying.is_final


def test_other_owner_cannot_write(release_store: ReleaseStore) -> None:
    release_store.create(P, W, Operation.apply, spec("a"))
    other = ReleaseStore(release_store.store, owner="someone-else")
    with pytest.raises(OwnerConflictError):
        other.set_phase(P, W, 1, Phase.failed)


def test_list_by_revision(release_store: ReleaseStore) -> None:
    for _ in range(11):
        r = release_store.create(P, W, Operation.apply, spec("a"))
        release_store.set_phase(P, W, r.revision, Phase.succeeded)
    assert [r.revision for r in release_store.list(P, W)] == list(range(1, 12))
    assert release_store.latest(P, W).revision == 11  # type: ignore[union-attr]
    assert release_store.latest_succeeded_revision(P, W) == 11


def test_destroy_release_has_no_spec(release_store: ReleaseStore) -> None:
    finish(release_store, release_store.create(P, W, Operation.apply, spec("a")), res("a"))
    d = release_store.create(P, W, Operation.destroy, None)
    assert d.operation is Operation.destroy and d.spec is None
    release_store.set_phase(P, W, 2, Phase.destroying)
    release_store.record_deletion(P, W, 2, "a")
    assert release_store.set_phase(P, W, 2, Phase.succeeded).state.resources == []


def test_release_record_tearing_down_is_not_retried_forever(release_store: ReleaseStore) -> None:
    release_store.create(P, W, Operation.apply, spec("a"))
    release_store.store.teardown("Release", f"{P}/{W}", "1", release_store.owner)
    with pytest.raises(PhaseConflictError, match="tearing down"):
        release_store.set_phase(P, W, 1, Phase.failed)
