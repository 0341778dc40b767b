"""State conformance, ReleaseReader: what the recorded releases say. Every backend (SQLite and
PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.engine.spec import parse_spec
from stackflow.model.release import Operation, Phase
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import BlobStore, ReleaseReader, ReleaseWriter, StackLocks
from tests.conformance.state.common import R1, R2, STACK, narrow, res


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, ReleaseReader, StackLocks, ReleaseWriter, BlobStore)


def test_latest_succeeded_and_spec_refs(backend: StateBackend) -> None:
    spec = parse_spec({"resources": [{"id": "a", "type": "OnPrem", "attributes": {}}]})
    assert backend.latest(STACK) is None and backend.latest_succeeded_revision(STACK) is None
    backend.create(STACK, Operation.apply, spec, run=R1)
    backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    backend.create(STACK, Operation.destroy, run=R2)
    backend.set_phase(STACK, 2, Phase.failed, run=R2)
    assert backend.latest_succeeded_revision(STACK) == 1
    latest = backend.latest(STACK)
    assert latest is not None and latest.revision == 2 and latest.spec is None
    assert backend.latest_spec_ref(STACK) == backend.put_spec(spec)
    assert backend.stacks() == [STACK]


def test_resource_ids_are_the_state_in_its_order(backend: Any) -> None:
    """``resource_ids``: the ids of every resource of a release's state (carried over from the
    release before, and recorded by this one), in the order ``resources`` gives them."""
    backend.create(STACK, Operation.apply, run=R1)
    backend.record_resource(STACK, 1, res("b", v=1), run=R1)
    backend.record_resource(STACK, 1, res("a", v=1), run=R1)
    backend.set_phase(STACK, 1, Phase.succeeded, run=R1)
    backend.create(STACK, Operation.apply, run=R2)
    backend.record_resource(STACK, 2, res("c", v=1), run=R2)
    backend.record_resource(STACK, 2, res("a", v=2), run=R2)
    assert backend.resource_ids(STACK, 2) == list(backend.resources(STACK, 2))
    assert sorted(backend.resource_ids(STACK, 2)) == ["a", "b", "c"]
    assert backend.resource_ids(STACK, 1) == list(backend.resources(STACK, 1))
    assert backend.resource_ids(STACK, 9) == []


def test_sealed_resources_are_the_state_as_stored(backend: Any) -> None:
    """``sealed_resources``: every resource of a release (the state carried over from the
    release before, and what this one recorded), by id in the state's order, as stored:
    sensitive values stay sealed, and opening a body gives what ``resources`` gives."""
    from stackflow.core.crypto import KeyRing, new_key_line
    from stackflow.model.spec import Resource
    from stackflow.state.backend import open_backend

    keyed = open_backend(
        backend.target.url, migrate=True, keys=KeyRing.parse(new_key_line("k1"), "test")
    )
    try:
        secret = Resource.model_validate(
            {
                "id": "v1:Secret:ns:db",
                "type": "Kubernetes",
                "attributes": {"kind": "Secret", "data": {"password": "aHVudGVyMg=="}},
            }
        )
        keyed.create(STACK, Operation.apply, run=R1)
        keyed.record_resource(STACK, 1, secret, run=R1)
        keyed.record_resource(STACK, 1, res("a", v=1), run=R1)
        keyed.set_phase(STACK, 1, Phase.succeeded, run=R1)
        keyed.create(STACK, Operation.apply, run=R2)
        keyed.record_resource(STACK, 2, res("a", v=2), run=R2)
        keyed.record_resource(STACK, 2, res("b", v=1), run=R2)
        stored = keyed.sealed_resources(STACK, 2)
        assert list(stored) == list(keyed.resources(STACK, 2))
        assert sorted(stored) == ["a", "b", secret.id]
        assert "aHVudGVyMg==" not in " ".join(stored.values())
        opened = {rid: keyed.sealer.open(STACK, body) for rid, body in stored.items()}
        assert opened == keyed.resources(STACK, 2)
        assert opened[secret.id] == secret and opened["a"] == res("a", v=2)
        assert keyed.sealed_resources(STACK, 1).keys() == {secret.id, "a"}
        assert keyed.sealed_resources(STACK, 9) == {}
    finally:
        keyed.close()
