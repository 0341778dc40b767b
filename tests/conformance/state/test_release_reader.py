"""State conformance, ReleaseReader: what the recorded releases say. Every backend (SQLite and
PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.release import Operation, Phase
from stackflow.spec import parse_spec
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import BlobStore, ReleaseReader, ReleaseWriter, StackLocks
from tests.conformance.state.common import R1, R2, STACK, narrow, res  # noqa: F401


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
