"""State conformance, TerraformStateStore: the latest OpenTofu state per resource, newest serial,
fenced. Every backend (SQLite and PostgreSQL: the ``backend`` fixture in tests/conftest.py)
passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.core.errors import (
    FencedError,
)
from stackflow.core.refs import StackRef
from stackflow.model.release import Operation, Phase
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import ReleaseWriter, StackLocks, TerraformStateStore
from tests.conformance.state.common import R1, R2, STACK, narrow, res  # noqa: F401


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, TerraformStateStore, StackLocks, ReleaseWriter)


def test_terraform_state_keeps_the_newest_serial_and_is_fenced(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    new = '{"lineage":"L","serial":3,"resources":[]}'
    old = '{"lineage":"L","serial":2,"resources":[]}'
    backend.put_terraform_state(STACK, "tf", new, revision=1, run=R1)
    backend.put_terraform_state(STACK, "tf", old, revision=1, run=R1)
    assert backend.get_terraform_state(STACK, "tf") == new
    with pytest.raises(FencedError):
        backend.put_terraform_state(STACK, "tf", '{"lineage":"L","serial":9}', revision=1, run=R2)
    assert backend.get_terraform_state(STACK, "tf") == new
    backend.delete_terraform_state(STACK, "tf", revision=1, run=R1)
    assert backend.get_terraform_state(STACK, "tf") is None


def test_terraform_states_read_together(backend: StateBackend) -> None:
    backend.create(STACK, Operation.apply, run=R1)
    bodies = {f"tf{i}": f'{{"lineage":"L{i}","serial":1,"resources":[]}}' for i in range(600)}
    backend.put_terraform_states(STACK, bodies, revision=1, run=R1)
    backend.create(StackRef("q", "w"), Operation.apply, run=R2)
    backend.put_terraform_state(
        StackRef("q", "w"), "tf1", '{"lineage":"X","serial":1}', revision=1, run=R2
    )
    # more ids than one query takes, a duplicate, one with no state, another stack's row
    found = backend.get_terraform_states(STACK, [*bodies, "tf1", "missing"])
    assert found == bodies
    assert backend.get_terraform_states(StackRef("q", "w"), ["tf1", "tf2"]) == {
        "tf1": '{"lineage":"X","serial":1}'
    }
    assert backend.get_terraform_states(STACK, []) == {}

    # written together as well (more rows than one statement takes): a newer serial replaces
    # the kept one, an older serial of the same lineage does not, a new lineage does
    again = {
        f"tf{i}": f'{{"lineage":"L{i}","serial":{(2, 0, 0)[i % 3]},"resources":[]}}'
        for i in range(600)
    }
    again = {k: v.replace('"L', '"M') if int(k[2:]) % 3 == 2 else v for k, v in again.items()}
    backend.put_terraform_states(STACK, again, revision=1, run=R1)
    expected = {k: bodies[k] if int(k[2:]) % 3 == 1 else v for k, v in again.items()}
    assert backend.get_terraform_states(STACK, list(bodies)) == expected
    with pytest.raises(FencedError):
        backend.put_terraform_states(STACK, {"tf0": bodies["tf0"]}, revision=1, run=R2)
    assert backend.get_terraform_state(STACK, "tf0") == again["tf0"]


def test_a_saved_plan_is_taken_once_by_its_release_and_digest(backend: StateBackend) -> None:
    other = StackRef("q", "w")
    plan = bytes(range(256)) * 40  # a plan file is a zip: any bytes
    backend.put_terraform_plan(STACK, 2, "d1", plan)
    backend.put_terraform_plan(STACK, 2, "d2", b"second")
    backend.put_terraform_plan(other, 2, "d1", b"another stack's")
    # another release, another digest, another stack: nothing
    assert backend.take_terraform_plan(STACK, 3, "d1") is None
    assert backend.take_terraform_plan(STACK, 2, "d3") is None
    assert backend.take_terraform_plan(STACK, 2, "d1") == plan
    assert backend.take_terraform_plan(STACK, 2, "d1") is None  # taken: applied once
    # a newer preview of the same inputs replaces the plan
    backend.put_terraform_plan(STACK, 2, "d2", b"newer")
    # a plan for a newer release drops what older releases kept
    backend.put_terraform_plan(STACK, 3, "d9", b"next release")
    assert backend.take_terraform_plan(STACK, 2, "d2") is None
    assert backend.take_terraform_plan(STACK, 3, "d9") == b"next release"
    assert backend.take_terraform_plan(other, 2, "d1") == b"another stack's"
    # a release that ends (succeeded, failed, unlocked, recovered) drops what it kept
    revision = backend.create(STACK, Operation.apply, run=R1).revision
    backend.put_terraform_plan(STACK, revision, "d", b"unused")
    backend.put_terraform_plan(other, 3, "d", b"another stack's, kept")
    backend.set_phase(STACK, revision, Phase.failed, run=R1)
    assert backend.take_terraform_plan(STACK, revision, "d") is None
    assert backend.take_terraform_plan(other, 3, "d") == b"another stack's, kept"
    revision = backend.create(STACK, Operation.apply, run=R2).revision
    backend.put_terraform_plan(STACK, revision, "d", b"unused")
    backend.unlock(STACK)
    assert backend.take_terraform_plan(STACK, revision, "d") is None
