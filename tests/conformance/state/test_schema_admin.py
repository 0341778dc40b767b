"""State conformance, SchemaAdmin: migrations and the schema's lifecycle, bad URLs. Every backend
(SQLite and PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from stackflow.core.errors import (
    SpecError,
)
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.protocols import SchemaAdmin
from stackflow.state.schema import HEAD_REVISION, metadata
from tests.conformance.state.common import R1, R2, narrow, res  # noqa: F401


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, SchemaAdmin)


def test_migrated_schema_matches_the_models(backend: StateBackend) -> None:
    assert backend.schema_revision() == backend.head_revision()
    backend.migrate()  # idempotent
    inspector = sa.inspect(backend.target.engine)
    for table in metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name


def test_the_head_revision_is_alembics_head_and_read_as_alembic_reads_it(
    backend: StateBackend,
) -> None:
    """HEAD_REVISION (checked without loading Alembic) is the newest migration Alembic
    knows, and the database's revision is what Alembic's own context reports."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from stackflow.state.models import MIGRATIONS

    assert backend.head_revision() == ScriptDirectory(str(MIGRATIONS)).get_current_head()
    with backend.target.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == HEAD_REVISION
    assert backend.schema_revision() == HEAD_REVISION


def test_bad_urls_are_one_clear_line(tmp_path: object) -> None:
    with pytest.raises(SpecError, match="scheme 'mysql' is not supported"):
        open_backend("mysql://x@y/z")
    with pytest.raises(SpecError, match="is not a URL"):
        open_backend("not a url")
