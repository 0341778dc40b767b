"""State conformance, RunKeys: the API's Idempotency-Key claims. A key is claimed once per
stack (a second claim gets the first, saying whether it was for the same request), holds the
run its start made, is given up when the start made none, and no longer counts after the
window. Every backend (SQLite and PostgreSQL) passes it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from stackflow.core.crypto import KeyRing
from stackflow.core.refs import StackRef
from stackflow.state.backend import open_backend
from stackflow.state.protocols import RunKeys
from stackflow.state.schema import run_keys
from tests.conformance.state.common import STACK, narrow

DAY = timedelta(days=1)


@pytest.fixture
def keys(backend: Any) -> Any:
    return narrow(backend, RunKeys)


def test_a_key_is_claimed_once_and_holds_its_run(keys: Any) -> None:
    assert keys.claim_run_key(STACK, "k1", "a" * 64, window=DAY) is None
    pending = keys.claim_run_key(STACK, "k1", "a" * 64, window=DAY)
    assert pending.same_request and pending.run_id is None and pending.workflow_id is None
    keys.record_run_key(STACK, "k1", "stackflow/p/w", "run-1")
    again = keys.claim_run_key(STACK, "k1", "a" * 64, window=DAY)
    assert (again.same_request, again.workflow_id, again.run_id) == (
        True,
        "stackflow/p/w",
        "run-1",
    )
    assert again.created_at.tzinfo is not None
    other = keys.claim_run_key(STACK, "k1", "b" * 64, window=DAY)
    assert not other.same_request and other.run_id == "run-1"
    # the same key on another stack is another claim
    assert keys.claim_run_key(StackRef("p", "other"), "k1", "b" * 64, window=DAY) is None


def test_a_claim_that_made_no_run_is_given_up(keys: Any) -> None:
    assert keys.claim_run_key(STACK, "k2", "a" * 64, window=DAY) is None
    keys.drop_run_key(STACK, "k2")
    assert keys.claim_run_key(STACK, "k2", "b" * 64, window=DAY) is None  # free again
    keys.record_run_key(STACK, "k2", "stackflow/p/w", "run-2")
    keys.drop_run_key(STACK, "k2")  # a claim that made a run stays
    assert keys.claim_run_key(STACK, "k2", "b" * 64, window=DAY).run_id == "run-2"


def test_a_claim_older_than_the_window_no_longer_counts(backend: Any, keys: Any) -> None:
    assert keys.claim_run_key(STACK, "k3", "a" * 64, window=DAY) is None
    keys.record_run_key(STACK, "k3", "stackflow/p/w", "run-3")
    assert keys.claim_run_key(STACK, "k3", "b" * 64, window=timedelta(0)) is None
    with backend.engine.connect() as conn:
        rows = conn.execute(run_keys.select()).all()
    assert [(r.key, r.run_id) for r in rows] == [("k3", None)]  # the old claim is gone


def test_the_request_digest_is_kept_keyed(tmp_path: Path) -> None:
    """With encryption keys the row holds an HMAC of the request's digest (it may cover
    secrets), not the digest itself; the claim still tells the same request from another."""
    ring = KeyRing(current="k1", keys={"k1": b"\x01" * 32})
    store = open_backend(f"sqlite:///{tmp_path / 'state.db'}", keys=ring)
    try:
        digest = "c" * 64
        assert store.claim_run_key(STACK, "k4", digest, window=DAY) is None
        with store.engine.connect() as conn:
            [row] = conn.execute(run_keys.select()).all()
        assert row.digest != digest and len(row.digest) == 64
        assert store.claim_run_key(STACK, "k4", digest, window=DAY).same_request
        assert not store.claim_run_key(STACK, "k4", "d" * 64, window=DAY).same_request
    finally:
        store.close()
