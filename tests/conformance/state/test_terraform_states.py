"""State conformance, TerraformStateStore: the latest OpenTofu state per resource, newest serial,
fenced. Every backend (SQLite and PostgreSQL: the ``backend`` fixture in tests/conftest.py)
passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.errors import (
    FencedError,
)
from stackflow.release import Operation
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import ReleaseWriter, StackLocks, TerraformStateStore
from tests.conformance.state.common import R1, R2, narrow, res  # noqa: F401


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, TerraformStateStore, StackLocks, ReleaseWriter)


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
