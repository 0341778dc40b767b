"""State conformance, ReleaseWriter: phases, per-node state, batched records, rollback and import,
sealing at rest. Every backend (SQLite and PostgreSQL: the ``backend`` fixture in
tests/conftest.py) passes it."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import sqlalchemy as sa

from stackflow.core.errors import (
    ConflictError,
    FencedError,
    NotFoundError,
    PhaseConflictError,
    StackLockedError,
)
from stackflow.engine.spec import parse_spec
from stackflow.model.release import Approval, Decision, Operation, Phase, Release
from stackflow.model.spec import Resource
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.protocols import BlobStore, ReleaseReader, ReleaseWriter, StackLocks
from stackflow.state.schema import blobs
from tests.conformance.state.common import R1, R2, STACK, narrow, res


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, ReleaseWriter, StackLocks, ReleaseReader, BlobStore)


def test_resource_state_is_written_per_node_and_carried_to_the_next_release(
    backend: StateBackend,
) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    backend.record_resource(STACK, 1, res("b", v=1), run=R1)
    backend.record_resource(STACK, 1, res("a", v=1), run=R1)
    backend.record_resource(STACK, 1, res("b", v=2), run=R1)  # upsert keeps its place
    assert [r.id for r in backend.get(STACK, 1).state.resources] == ["b", "a"]
    assert backend.resource_state(STACK, 1, "b") == res("b", v=2)
    assert backend.resources(STACK, 1, ["a", "zz"]) == {"a": res("a", v=1)}
    backend.set_phase(STACK, 1, Phase.failed, run=R1, error="boom")
    second = backend.create(STACK, Operation.apply, run=R2)
    assert second.revision == 2 and [r.id for r in second.state.resources] == ["b", "a"]
    backend.record_deletion(STACK, 2, "b", run=R2)
    backend.record_deletion(STACK, 2, "b", run=R2)  # idempotent
    assert list(backend.resources(STACK, 2)) == ["a"]
    assert list(backend.resources(STACK, 1)) == ["b", "a"]  # release 1 kept its state
    listed = backend.list(STACK)
    assert [(r.revision, r.resource_count) for r in listed] == [(1, 2), (2, 1)]


def test_final_phase_rules_and_approval(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    approval = Approval(decision=Decision.approved, by="ann", at=backend.get(STACK, 1).created_at)
    backend.set_phase(STACK, 1, Phase.succeeded, run=R1, approval=approval)
    assert backend.set_phase(STACK, 1, Phase.succeeded, run=R2).phase is Phase.succeeded
    with pytest.raises(PhaseConflictError):
        backend.set_phase(STACK, 1, Phase.failed, run=R1)
    assert backend.get(STACK, 1).approval == approval
    with pytest.raises(NotFoundError):
        backend.set_phase(STACK, 9, Phase.failed, run=R1)
    with pytest.raises(NotFoundError):
        backend.get(STACK, 9)


def test_batched_records_and_deletions_are_one_fenced_write(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    backend.record_resources(STACK, 1, [res("a", v=1), res("b", v=1)], run=R1)
    backend.record_resources(STACK, 1, [res("b", v=2), res("c", v=1)], run=R1)
    state = backend.get(STACK, 1).state.resources
    assert [(r.id, r.attributes["v"]) for r in state] == [("a", 1), ("b", 2), ("c", 1)]
    with pytest.raises(FencedError):
        backend.record_resources(STACK, 1, [res("d", v=1), res("a", v=9)], run=R2)
    with pytest.raises(FencedError):
        backend.record_deletions(STACK, 1, ["a", "b"], run=R2)
    assert [r.id for r in backend.get(STACK, 1).state.resources] == ["a", "b", "c"]
    backend.record_deletions(STACK, 1, ["a", "c", "never-there"], run=R1)
    assert [r.id for r in backend.get(STACK, 1).state.resources] == ["b"]


def test_a_rollback_release_records_the_revision_it_restores(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {}}]})
    backend.create(STACK, Operation.apply, spec, run=R1)
    backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    ref = backend.get(STACK, 1, with_spec=False).spec_ref
    rolled = backend.create(STACK, Operation.rollback, spec_ref=ref, run=R2, source_revision=1)
    assert (rolled.revision, rolled.operation, rolled.source_revision) == (2, "rollback", 1)
    again = backend.get(STACK, 2)
    assert again.operation is Operation.rollback and again.source_revision == 1
    assert again.spec == spec
    listed = {r.revision: r.source_revision for r in backend.list(STACK)}
    assert listed == {1: None, 2: 1}


def test_import_keeps_revisions_and_an_in_progress_release_locks_with_no_run(
    backend: StateBackend,
) -> None:
    stamp = "2024-05-10T16:48:00+08:00"
    release = Release.model_validate(
        {
            "project": "p",
            "workspace": "w",
            "revision": 3,
            "phase": "applying",
            "state": {"resources": [{"id": "a", "type": "OnPrem", "attributes": {}}]},
            "createTime": stamp,
            "modifiedTime": stamp,
        }
    )
    backend.import_release(release)
    with pytest.raises(ConflictError):
        backend.import_release(release)
    lock = backend.lock(STACK)
    assert lock is not None and lock.revision == 3 and lock.holder() is None
    got = backend.get(STACK, 3)
    assert got.created_at == release.created_at and [r.id for r in got.state.resources] == ["a"]
    with pytest.raises(StackLockedError, match="no recorded run"):
        backend.create(STACK, Operation.apply, run=R1)
    assert backend.unlock(STACK).phase is Phase.failed
    assert backend.create(STACK, Operation.apply, run=R1).revision == 4


def test_an_imported_release_never_points_at_a_spec_it_does_not_carry(
    backend: StateBackend,
) -> None:
    """A release to import (a Kusion file, the API's import body) that names a stored spec by
    ``spec_ref`` instead of carrying one gets no spec: the ref is the store's own pointer,
    and taking it from input would show another stack's spec under this one."""
    theirs = parse_spec({"resources": [{"id": "secret-plan", "type": "OnPrem", "attributes": {}}]})
    ref = backend.put_spec(theirs)
    release = Release.model_validate(
        {
            "project": "p",
            "workspace": "w",
            "revision": 1,
            "phase": "succeeded",
            "spec_ref": ref,
            "createTime": "2024-05-10T16:48:00+08:00",
            "modifiedTime": "2024-05-10T16:48:00+08:00",
        }
    )
    assert release.spec_ref == ref  # the model reads it: the store must not use it
    backend.import_release(release)
    assert backend.get(STACK, 1).spec is None


def test_sensitive_values_are_sealed_at_rest_and_bound_to_their_row(backend: StateBackend) -> None:
    from stackflow.core.crypto import EncryptionKeyError, KeyRing, new_key_line
    from stackflow.state.schema import release_resources, terraform_plans, terraform_states

    ring = KeyRing.parse(new_key_line("k1"), "test")
    sealed = open_backend(backend.target.url, migrate=True, keys=ring)
    try:
        secret = Resource.model_validate(
            {
                "id": "v1:Secret:ns:db",
                "type": "Kubernetes",
                "attributes": {"kind": "Secret", "data": {"password": "aHVudGVyMg=="}},
            }
        )
        spec = parse_spec({"resources": [], "context": {"env": {"TOKEN": "tok-plain-123"}}})
        sealed.create(STACK, Operation.apply, spec, run=R1)
        sealed.record_resource(STACK, 1, secret, run=R1)
        other = secret.model_copy(update={"id": "v1:Secret:ns:other"})
        sealed.record_resource(STACK, 1, other, run=R1)
        tfstate = '{"lineage":"L","serial":1,"resources":[{"password":"tf-secret-456"}]}'
        sealed.put_terraform_state(STACK, "tf", tfstate, revision=1, run=R1)
        sealed.put_terraform_plan(STACK, 1, "d", b"plan holding tf-secret-456")
        with sealed.engine.begin() as conn:  # the raw rows: no secret in clear
            raw = " ".join(str(r.body) for r in conn.execute(sa.select(release_resources)))
            raw += " ".join(r.body for r in conn.execute(sa.select(terraform_states)))
            raw += " ".join(repr(r.body) for r in conn.execute(sa.select(blobs)))
            rows = list(conn.execute(sa.select(terraform_plans)))
            plans = " ".join(r.body for r in rows)
        # the digest (taken over sensitive variables) is kept keyed, not as given
        assert [len(r.digest) for r in rows] == [64] and rows[0].digest != "d"
        # the plan is kept base64-encoded: sealed, neither it nor its encoding shows
        assert plans.startswith('{"$sealed"')
        assert base64.b64encode(b"plan holding tf-secret-456").decode()[:20] not in plans
        for plain in ("aHVudGVyMg==", "tf-secret-456", "tok-plain-123"):
            assert plain not in raw
        assert sealed.resource_state(STACK, 1, secret.id) == secret
        assert sealed.get_terraform_state(STACK, "tf") == tfstate
        assert sealed.take_terraform_plan(STACK, 1, "d") == b"plan holding tf-secret-456"
        assert sealed.get(STACK, 1).spec == spec
        # a ciphertext copied onto another resource's row does not decrypt
        with sealed.engine.begin() as conn:
            body = conn.execute(
                sa.select(release_resources.c.body).where(
                    release_resources.c.resource_id == secret.id
                )
            ).scalar_one()
            conn.execute(
                release_resources.update()
                .where(release_resources.c.resource_id == other.id)
                .values(body=body.replace(secret.id, other.id))
            )
        with pytest.raises(EncryptionKeyError, match="altered or copied"):
            sealed.resource_state(STACK, 1, other.id)
        # rotation: data under k1 reads once k2 is current; without k1 it is one clear error
        k2 = new_key_line("k2")
        rotated = open_backend(backend.target.url, keys=KeyRing.parse(f"{k2},k1:{_b64(ring)}", "t"))
        assert rotated.resource_state(STACK, 1, secret.id) == secret
        rotated.close()
        only_k2 = open_backend(backend.target.url, keys=KeyRing.parse(k2, "t"))
        with pytest.raises(EncryptionKeyError, match="key 'k1', which this process does not"):
            only_k2.resource_state(STACK, 1, secret.id)
        only_k2.close()
    finally:
        sealed.close()


def _b64(ring: object) -> str:
    import base64

    return base64.b64encode(ring.keys["k1"]).decode()  # type: ignore[attr-defined]
