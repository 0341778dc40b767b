"""The one suite every state backend passes (SQLite and PostgreSQL, see conftest.py):
releases and their state, the run-owned stack lock and its fencing, blobs, Terraform states,
schema migrations."""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from stackflow.errors import (
    ConflictError,
    FencedError,
    NotFoundError,
    PhaseConflictError,
    SpecError,
    StackLockedError,
)
from stackflow.release import Approval, Decision, Operation, Phase, Release
from stackflow.spec import Resource, parse_spec
from stackflow.state.backend import RunRef, StackLock, StateBackend, blob_ref, open_backend
from stackflow.state.schema import blobs, metadata

R1 = RunRef("stackflow/p/w", "run-1")
R2 = RunRef("stackflow/p/w", "run-2")


def res(rid: str, **attributes: object) -> Resource:
    return Resource.model_validate({"id": rid, "type": "OnPrem", "attributes": attributes})


def test_migrated_schema_matches_the_models(backend: StateBackend) -> None:
    assert backend.schema_revision() == backend.head_revision()
    backend.migrate()  # idempotent
    inspector = sa.inspect(backend.engine)
    for table in metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name


def test_first_release_takes_the_lock_and_final_phase_frees_it(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {"x": 1}}]})
    release = backend.create("p", "w", Operation.apply, spec, run=R1)
    assert (release.revision, release.phase) == (1, Phase.generating)
    lock = backend.lock("p", "w")
    assert lock is not None and lock.revision == 1 and lock.held_by(R1)
    assert not lock.held_by(R2)
    stored = backend.get("p", "w", 1)
    assert stored.spec == spec and stored.run_id == R1.run_id and stored.spec_ref
    backend.set_phase("p", "w", 1, Phase.applying, run=R1)
    assert backend.lock("p", "w") is not None
    done = backend.set_phase("p", "w", 1, Phase.succeeded, run=R1, changes={"n": 1})
    assert done.phase is Phase.succeeded and backend.lock("p", "w") is None
    assert backend.get("p", "w", 1).changes == {"n": 1}


def test_second_run_is_refused_while_the_first_holds_the_stack(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    with pytest.raises(StackLockedError, match=r"release 1 \(apply\) held by run run-1"):
        backend.create("p", "w", Operation.apply, run=R2)
    assert backend.revisions("p", "w") == [1]


def test_resource_state_is_written_per_node_and_carried_to_the_next_release(
    backend: StateBackend,
) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    backend.record_resource("p", "w", 1, res("b", v=1), run=R1)
    backend.record_resource("p", "w", 1, res("a", v=1), run=R1)
    backend.record_resource("p", "w", 1, res("b", v=2), run=R1)  # upsert keeps its place
    assert [r.id for r in backend.get("p", "w", 1).state.resources] == ["b", "a"]
    assert backend.resource_state("p", "w", 1, "b") == res("b", v=2)
    assert backend.resources("p", "w", 1, ["a", "zz"]) == {"a": res("a", v=1)}
    backend.set_phase("p", "w", 1, Phase.failed, run=R1, error="boom")
    second = backend.create("p", "w", Operation.apply, run=R2)
    assert second.revision == 2 and [r.id for r in second.state.resources] == ["b", "a"]
    backend.record_deletion("p", "w", 2, "b", run=R2)
    backend.record_deletion("p", "w", 2, "b", run=R2)  # idempotent
    assert list(backend.resources("p", "w", 2)) == ["a"]
    assert list(backend.resources("p", "w", 1)) == ["b", "a"]  # release 1 kept its state
    listed = backend.list("p", "w")
    assert [(r.revision, r.resource_count) for r in listed] == [(1, 2), (2, 1)]


def test_writes_from_a_run_that_does_not_hold_the_stack_are_refused(
    backend: StateBackend,
) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    backend.record_resource("p", "w", 1, res("a", v=1), run=R1)
    with pytest.raises(FencedError, match="run-2"):
        backend.record_resource("p", "w", 1, res("a", v=666), run=R2)
    with pytest.raises(FencedError):
        backend.record_deletion("p", "w", 1, "a", run=R2)
    with pytest.raises(FencedError):
        backend.set_phase("p", "w", 1, Phase.succeeded, run=R2)
    with pytest.raises(FencedError):
        backend.assert_holds("p", "w", 1, R2)
    backend.assert_holds("p", "w", 1, R1)
    assert backend.resource_state("p", "w", 1, "a") == res("a", v=1)
    assert backend.phase_of("p", "w", 1) is Phase.generating


def test_forced_unlock_fences_the_old_run_out(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    backend.record_resource("p", "w", 1, res("a"), run=R1)
    after = backend.unlock("p", "w")
    assert after.phase is Phase.failed and "unlocked by hand" in (after.error or "")
    assert backend.lock("p", "w") is None
    with pytest.raises(FencedError):
        backend.record_resource("p", "w", 1, res("late"), run=R1)
    with pytest.raises(PhaseConflictError):
        backend.set_phase("p", "w", 1, Phase.succeeded, run=R1)
    # the next release starts from what release 1 recorded, without the refused write
    nxt = backend.create("p", "w", Operation.destroy, run=R2)
    assert [r.id for r in nxt.state.resources] == ["a"]
    with pytest.raises(FencedError):  # an old run never writes into a newer release either
        backend.record_resource("p", "w", 2, res("late"), run=R1)


def test_recover_and_transfer_are_compare_and_set(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    lock = backend.lock("p", "w")
    assert lock is not None
    stale = lock.model_copy(update={"run_id": "someone-else"})
    assert not backend.recover(stale, "nope") and backend.lock("p", "w") == lock
    assert backend.transfer(lock, R2)
    assert not backend.transfer(lock, R2)  # the lock moved on
    backend.record_resource("p", "w", 1, res("a"), run=R2)
    with pytest.raises(FencedError):
        backend.record_resource("p", "w", 1, res("b"), run=R1)
    moved = backend.lock("p", "w")
    assert moved is not None and backend.recover(moved, "run-2 was terminated")
    closed = backend.get("p", "w", 1)
    assert closed.phase is Phase.failed and closed.error == "run-2 was terminated"
    assert closed.run_id == "run-2" and backend.lock("p", "w") is None


def test_final_phase_rules_and_approval(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    approval = Approval(
        decision=Decision.approved, by="ann", at=backend.get("p", "w", 1).created_at
    )
    backend.set_phase("p", "w", 1, Phase.succeeded, run=R1, approval=approval)
    assert backend.set_phase("p", "w", 1, Phase.succeeded, run=R2).phase is Phase.succeeded
    with pytest.raises(PhaseConflictError):
        backend.set_phase("p", "w", 1, Phase.failed, run=R1)
    assert backend.get("p", "w", 1).approval == approval
    with pytest.raises(NotFoundError):
        backend.set_phase("p", "w", 9, Phase.failed, run=R1)
    with pytest.raises(NotFoundError):
        backend.get("p", "w", 9)


def test_latest_succeeded_and_spec_refs(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {}}]})
    assert backend.latest("p", "w") is None and backend.latest_succeeded_revision("p", "w") is None
    backend.create("p", "w", Operation.apply, spec, run=R1)
    backend.set_phase("p", "w", 1, Phase.succeeded, run=R1)
    backend.create("p", "w", Operation.destroy, run=R2)
    backend.set_phase("p", "w", 2, Phase.failed, run=R2)
    assert backend.latest_succeeded_revision("p", "w") == 1
    latest = backend.latest("p", "w")
    assert latest is not None and latest.revision == 2 and latest.spec is None
    assert backend.latest_spec_ref("p", "w") == backend.put_spec(spec)
    assert backend.stacks() == [("p", "w")]


def test_batched_records_and_deletions_are_one_fenced_write(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    backend.record_resources("p", "w", 1, [res("a", v=1), res("b", v=1)], run=R1)
    backend.record_resources("p", "w", 1, [res("b", v=2), res("c", v=1)], run=R1)
    state = backend.get("p", "w", 1).state.resources
    assert [(r.id, r.attributes["v"]) for r in state] == [("a", 1), ("b", 2), ("c", 1)]
    with pytest.raises(FencedError):
        backend.record_resources("p", "w", 1, [res("d", v=1), res("a", v=9)], run=R2)
    with pytest.raises(FencedError):
        backend.record_deletions("p", "w", 1, ["a", "b"], run=R2)
    assert [r.id for r in backend.get("p", "w", 1).state.resources] == ["a", "b", "c"]
    backend.record_deletions("p", "w", 1, ["a", "c", "never-there"], run=R1)
    assert [r.id for r in backend.get("p", "w", 1).state.resources] == ["b"]


def test_a_rollback_release_records_the_revision_it_restores(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {}}]})
    backend.create("p", "w", Operation.apply, spec, run=R1)
    backend.set_phase("p", "w", 1, Phase.succeeded, run=R1)
    ref = backend.get("p", "w", 1, with_spec=False).spec_ref
    rolled = backend.create("p", "w", Operation.rollback, spec_ref=ref, run=R2, source_revision=1)
    assert (rolled.revision, rolled.operation, rolled.source_revision) == (2, "rollback", 1)
    again = backend.get("p", "w", 2)
    assert again.operation is Operation.rollback and again.source_revision == 1
    assert again.spec == spec
    listed = {r.revision: r.source_revision for r in backend.list("p", "w")}
    assert listed == {1: None, 2: 1}


def test_drift_reports_newest_first_and_idempotent(backend: StateBackend) -> None:
    from datetime import UTC, datetime, timedelta

    from stackflow.drift import DriftReport, DriftSummary

    assert backend.drift_reports("p", "w") == []
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = DriftReport(
        project="p",
        workspace="w",
        checked_at=t0,
        revision=3,
        drifted=False,
        summary=DriftSummary(checked=2),
    )
    second = first.model_copy(
        update={
            "checked_at": t0 + timedelta(hours=1),
            "drifted": True,
            "summary": DriftSummary(checked=2, drifted=1, ids=["a"]),
            "report_ref": "sha256:" + "0" * 64,
            "repair_workflow_id": "stackflow/p/w",
        }
    )
    backend.put_drift_report(first)
    backend.put_drift_report(second)
    backend.put_drift_report(second)  # a retried activity writes the same row
    got = backend.drift_reports("p", "w", limit=5)
    assert [r.drifted for r in got] == [True, False]
    assert got[0] == second and got[1] == first
    assert backend.drift_reports("p", "other") == []


def test_blobs_are_content_addressed_and_hash_checked(backend: StateBackend) -> None:
    body = b'{"big": "' + b"x" * 100_000 + b'"}'
    ref = backend.put_blob("spec_ref", body)
    assert ref == blob_ref(body) and backend.put_blob("spec_ref", body) == ref
    assert backend.get_blob("spec_ref", ref) == body
    with pytest.raises(SpecError, match="not found"):
        backend.get_blob("spec_ref", blob_ref(b"other"))
    with pytest.raises(SpecError, match="expected 'sha256"):
        backend.get_blob("spec_ref", "sha256:../../etc/passwd")
    with backend.engine.begin() as conn:  # corrupt the stored bytes
        conn.execute(blobs.update().where(blobs.c.ref == ref).values(body=zlib.compress(b"{}")))
    with pytest.raises(SpecError, match="do not match their hash"):
        backend.get_blob("spec_ref", ref)


def test_terraform_state_keeps_the_newest_serial_and_is_fenced(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    new = '{"lineage":"L","serial":3,"resources":[]}'
    old = '{"lineage":"L","serial":2,"resources":[]}'
    backend.put_terraform_state("p", "w", "tf", new, revision=1, run=R1)
    backend.put_terraform_state("p", "w", "tf", old, revision=1, run=R1)
    assert backend.get_terraform_state("p", "w", "tf") == new
    with pytest.raises(FencedError):
        backend.put_terraform_state(
            "p", "w", "tf", '{"lineage":"L","serial":9}', revision=1, run=R2
        )
    assert backend.get_terraform_state("p", "w", "tf") == new
    backend.delete_terraform_state("p", "w", "tf", revision=1, run=R1)
    assert backend.get_terraform_state("p", "w", "tf") is None


def test_terraform_states_read_together(backend: StateBackend) -> None:
    backend.create("p", "w", Operation.apply, run=R1)
    bodies = {f"tf{i}": f'{{"lineage":"L{i}","serial":1,"resources":[]}}' for i in range(600)}
    backend.put_terraform_states("p", "w", bodies, revision=1, run=R1)
    backend.create("q", "w", Operation.apply, run=R2)
    backend.put_terraform_state("q", "w", "tf1", '{"lineage":"X","serial":1}', revision=1, run=R2)
    # more ids than one query takes, a duplicate, one with no state, another stack's row
    found = backend.get_terraform_states("p", "w", [*bodies, "tf1", "missing"])
    assert found == bodies
    assert backend.get_terraform_states("q", "w", ["tf1", "tf2"]) == {
        "tf1": '{"lineage":"X","serial":1}'
    }
    assert backend.get_terraform_states("p", "w", []) == {}

    # written together as well (more rows than one statement takes): a newer serial replaces
    # the kept one, an older serial of the same lineage does not, a new lineage does
    again = {
        f"tf{i}": f'{{"lineage":"L{i}","serial":{(2, 0, 0)[i % 3]},"resources":[]}}'
        for i in range(600)
    }
    again = {k: v.replace('"L', '"M') if int(k[2:]) % 3 == 2 else v for k, v in again.items()}
    backend.put_terraform_states("p", "w", again, revision=1, run=R1)
    expected = {k: bodies[k] if int(k[2:]) % 3 == 1 else v for k, v in again.items()}
    assert backend.get_terraform_states("p", "w", list(bodies)) == expected
    with pytest.raises(FencedError):
        backend.put_terraform_states("p", "w", {"tf0": bodies["tf0"]}, revision=1, run=R2)
    assert backend.get_terraform_state("p", "w", "tf0") == again["tf0"]


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
    lock = backend.lock("p", "w")
    assert lock is not None and lock.revision == 3 and lock.holder() is None
    got = backend.get("p", "w", 3)
    assert got.created_at == release.created_at and [r.id for r in got.state.resources] == ["a"]
    with pytest.raises(StackLockedError, match="no recorded run"):
        backend.create("p", "w", Operation.apply, run=R1)
    assert backend.unlock("p", "w").phase is Phase.failed
    assert backend.create("p", "w", Operation.apply, run=R1).revision == 4


def test_concurrent_creates_give_one_lock_and_parallel_writes_all_land(
    backend: StateBackend,
) -> None:
    barrier = threading.Barrier(8)

    def attempt(n: int) -> int | None:
        barrier.wait()
        try:
            return backend.create("p", "w", Operation.apply, run=RunRef("wf", f"r{n}")).revision
        except StackLockedError:
            return None

    with ThreadPoolExecutor(8) as pool:
        won = [r for r in pool.map(attempt, range(8)) if r is not None]
    assert won == [1]
    lock = backend.lock("p", "w")
    assert lock is not None
    holder = lock.holder()
    assert holder is not None
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: backend.record_resource("p", "w", 1, res(f"n{i}", i=i), run=holder),
                range(200),
            )
        )
    state = backend.resources("p", "w", 1)
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


def test_bad_urls_are_one_clear_line(tmp_path: object) -> None:
    with pytest.raises(SpecError, match="scheme 'mysql' is not supported"):
        open_backend("mysql://x@y/z")
    with pytest.raises(SpecError, match="is not a URL"):
        open_backend("not a url")


def test_sensitive_values_are_sealed_at_rest_and_bound_to_their_row(backend: StateBackend) -> None:
    from stackflow.crypto import EncryptionKeyError, KeyRing, new_key_line
    from stackflow.state.schema import release_resources, terraform_states

    ring = KeyRing.parse(new_key_line("k1"), "test")
    sealed = open_backend(backend.url, migrate=True, keys=ring)
    try:
        secret = Resource.model_validate(
            {
                "id": "v1:Secret:ns:db",
                "type": "Kubernetes",
                "attributes": {"kind": "Secret", "data": {"password": "aHVudGVyMg=="}},
            }
        )
        spec = parse_spec({"resources": [], "context": {"env": {"TOKEN": "tok-plain-123"}}})
        sealed.create("p", "w", Operation.apply, spec, run=R1)
        sealed.record_resource("p", "w", 1, secret, run=R1)
        other = secret.model_copy(update={"id": "v1:Secret:ns:other"})
        sealed.record_resource("p", "w", 1, other, run=R1)
        tfstate = '{"lineage":"L","serial":1,"resources":[{"password":"tf-secret-456"}]}'
        sealed.put_terraform_state("p", "w", "tf", tfstate, revision=1, run=R1)
        with sealed.engine.begin() as conn:  # the raw rows: no secret in clear
            raw = " ".join(str(r.body) for r in conn.execute(sa.select(release_resources)))
            raw += " ".join(r.body for r in conn.execute(sa.select(terraform_states)))
            raw += " ".join(repr(r.body) for r in conn.execute(sa.select(blobs)))
        for plain in ("aHVudGVyMg==", "tf-secret-456", "tok-plain-123"):
            assert plain not in raw
        assert sealed.resource_state("p", "w", 1, secret.id) == secret
        assert sealed.get_terraform_state("p", "w", "tf") == tfstate
        assert sealed.get("p", "w", 1).spec == spec
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
            sealed.resource_state("p", "w", 1, other.id)
        # rotation: data under k1 reads once k2 is current; without k1 it is one clear error
        k2 = new_key_line("k2")
        rotated = open_backend(backend.url, keys=KeyRing.parse(f"{k2},k1:{_b64(ring)}", "t"))
        assert rotated.resource_state("p", "w", 1, secret.id) == secret
        rotated.close()
        only_k2 = open_backend(backend.url, keys=KeyRing.parse(k2, "t"))
        with pytest.raises(EncryptionKeyError, match="key 'k1', which this process does not"):
            only_k2.resource_state("p", "w", 1, secret.id)
        only_k2.close()
    finally:
        sealed.close()


def _b64(ring: object) -> str:
    import base64

    return base64.b64encode(ring.keys["k1"]).decode()  # type: ignore[attr-defined]
