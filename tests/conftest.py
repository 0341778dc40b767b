"""Fixtures every test directory shares: the state backends (SQLite, PostgreSQL)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.schema import metadata

# OnPrem files of the tests live under the temporary directory: the worker policy confines
# OnPrem paths to STACKFLOW_ONPREM_ROOTS (`make env` exports it; this covers shells that
# predate it, and the workers tests start in process).
os.environ.setdefault("STACKFLOW_ONPREM_ROOTS", tempfile.gettempdir())

DEV_API = {
    name: os.environ.pop(name)
    for name in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN")
    if name in os.environ
} or json.loads(os.environ.get("_STACKFLOW_TESTS_DEV_API", "{}"))
"""The dev API's address and token (`make env`), kept for the tests of that service and taken
out of the environment every other test inherits: with them, a CLI the tests run would go
through the dev API (its worker, queue and database) instead of the test's own."""
os.environ["_STACKFLOW_TESTS_DEV_API"] = json.dumps(DEV_API)  # for pytest-xdist's workers,
# which start with this process's environment, after the pop

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of its own on the dev PostgreSQL (`make up`), dropped at the end."""
    import psycopg
    import sqlalchemy as sa

    base = os.environ.get("STACKFLOW_POSTGRES_URL")
    if not base:
        pytest.fail(
            "STACKFLOW_POSTGRES_URL is not set: start the services with `make up` and "
            '`eval "$(make -s env)"` (or run `make test`)',
            pytrace=False,
        )
    name = f"sf_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StateBackend]:
    """Every backend passes the same suite: SQLite in a fresh file, PostgreSQL in a
    session database emptied before each test. Without encryption keys (the dev loop's are
    in the environment): tests that seal open their own backend with keys."""
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY_FILE", raising=False)
    if request.param == "sqlite":
        store = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    else:
        store = open_backend(request.getfixturevalue("postgres_url"), migrate=True)
        with store.engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
    try:
        yield store
    finally:
        store.close()
