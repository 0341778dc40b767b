"""State conformance, BlobStore: content-addressed, hash-checked blobs. Every backend (SQLite and
PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from stackflow.core.errors import (
    SpecError,
)
from stackflow.state.backend import StateBackend, blob_ref
from stackflow.state.protocols import BlobStore
from stackflow.state.schema import blobs
from tests.conformance.state.common import R1, R2, narrow, res  # noqa: F401


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, BlobStore)


def test_blobs_are_content_addressed_and_hash_checked(backend: StateBackend) -> None:
    body = b'{"big": "' + b"x" * 100_000 + b'"}'
    ref = backend.put_blob("spec_ref", body)
    assert ref == blob_ref(body) and backend.put_blob("spec_ref", body) == ref
    assert backend.get_blob("spec_ref", ref) == body
    with pytest.raises(SpecError, match="not found"):
        backend.get_blob("spec_ref", blob_ref(b"other"))
    with pytest.raises(SpecError, match="expected 'sha256"):
        backend.get_blob("spec_ref", "sha256:../../etc/passwd")
    with backend.target.engine.begin() as conn:  # corrupt the stored bytes
        conn.execute(blobs.update().where(blobs.c.ref == ref).values(body=zlib.compress(b"{}")))
    with pytest.raises(SpecError, match="do not match their hash"):
        backend.get_blob("spec_ref", ref)
