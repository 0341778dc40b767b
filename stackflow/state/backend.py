"""The state backend: the one system of record every worker and the CLI share.

Releases (Kusion's fields and phases), the state of each resource per release (written as
each node finishes), content-addressed spec and plan blobs, the stack lock and the latest
OpenTofu state of each Terraform resource, in one SQL schema (:mod:`stackflow.state.schema`,
migrated by Alembic). Two implementations share all of the logic here and differ in what
their engines do differently: :class:`SqliteBackend` (embedded, WAL, writers serialised by
``BEGIN IMMEDIATE``) and :class:`PostgresBackend` (psycopg 3, row locks on the stack lock).

The lock belongs to a run: it records (revision, workflow id, run id), and every write to a
stack's state is a compare-and-set on that run inside the write's own transaction. A write
from any other run raises :class:`FencedError` and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stackflow.core.crypto import KeyRing
from stackflow.core.errors import (
    SpecError,
)
from stackflow.core.refs import RunRef
from stackflow.state.models import (
    StackLock,
    blob_ref,
    check_ref,
    default_state_url,
    redact_url,
)
from stackflow.state.path_claims import PathClaimStore
from stackflow.state.protocols import (
    BlobStore,
    DriftReportStore,
    NotificationStore,
    PathClaims,
    PolicyBindings,
    ReleaseReader,
    ReleaseWriter,
    RunEventLog,
    RunKeys,
    SchemaAdmin,
    SourceBindings,
    StackLocks,
    TerraformStateStore,
)


class StateBackend(PathClaimStore):
    """Everything stackflow stores, on one SQL engine. Thread-safe; every method is sync.
    It satisfies every protocol of :mod:`stackflow.state.protocols`."""


class SqliteBackend(StateBackend):
    """Embedded: one file in WAL mode; write transactions take the database's write lock up
    front (``BEGIN IMMEDIATE``), which is what serialises and fences writers."""

    dialect = "sqlite"

    def __init__(self, url: str, keys: KeyRing | None = None) -> None:
        parsed = sa.make_url(url)
        if parsed.database and parsed.database != ":memory:":
            path = Path(parsed.database).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            parsed = parsed.set(database=str(path))
        engine = sa.create_engine(parsed, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get("stackflow_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        super().__init__(url, engine, keys)

    def _insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.sqlite import insert

        return insert(table)


class PostgresBackend(StateBackend):
    """PostgreSQL through psycopg 3: writers of a stack take its lock row (``FOR SHARE`` for
    resource writes, ``FOR UPDATE`` for phase changes, unlock and recovery)."""

    dialect = "postgresql"

    def __init__(self, url: str, keys: KeyRing | None = None) -> None:
        parsed = sa.make_url(url).set(drivername="postgresql+psycopg")
        engine = sa.create_engine(
            parsed,
            pool_size=8,
            max_overflow=16,
            pool_pre_ping=True,
            connect_args={"connect_timeout": 10},
        )
        super().__init__(url, engine, keys)

    def _insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.postgresql import insert

        return insert(table)

    @contextmanager
    def _migration_guard(self, conn: Connection) -> Iterator[None]:
        # Workers starting together migrate one at a time (released at commit).
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7236111)")
        yield

    @contextmanager
    def _run_lock(self, conn: Connection, run_id: str) -> Iterator[None]:
        # One run's appends one at a time, each until its commit: commit order is seq order.
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:run, 7236112))"),
            {"run": run_id},
        )
        yield


def open_backend(
    url: str | None = None, *, migrate: bool = False, keys: KeyRing | None = None
) -> StateBackend:
    """The backend ``url`` (default :func:`default_state_url`) names.

    ``migrate`` brings its schema up to date (the worker and ``stackflow state migrate``);
    otherwise an embedded SQLite database is migrated on first use and a server database
    must already be migrated (:class:`SchemaError` names the command).
    """
    url = url or default_state_url()
    try:
        scheme = sa.make_url(url).get_backend_name()
    except sa.exc.ArgumentError:
        raise SpecError(
            f"STACKFLOW_STATE_URL {redact_url(url)!r} is not a URL: use sqlite:///<path> "
            "or postgresql://user:password@host:port/database"
        ) from None
    keys = keys if keys is not None else KeyRing.from_env()
    backend: StateBackend
    if scheme == "sqlite":
        backend = SqliteBackend(url, keys)
        migrate = True
    elif scheme in ("postgresql", "postgres"):
        backend = PostgresBackend(url, keys)
    else:
        raise SpecError(
            f"STACKFLOW_STATE_URL scheme {scheme!r} is not supported: use sqlite:///<path> "
            "or postgresql://user:password@host:port/database"
        )
    if migrate:
        backend.migrate()
    else:
        backend.check_schema()
    return backend


__all__ = [
    "PostgresBackend",
    "RunRef",
    "SqliteBackend",
    "StackLock",
    "StateBackend",
    "blob_ref",
    "check_ref",
    "default_state_url",
    "open_backend",
    "redact_url",
]


if TYPE_CHECKING:  # mypy proves StateBackend satisfies every protocol of the interface

    def _satisfies_every_protocol(
        backend: StateBackend,
    ) -> tuple[
        SchemaAdmin,
        BlobStore,
        ReleaseReader,
        StackLocks,
        ReleaseWriter,
        DriftReportStore,
        TerraformStateStore,
        RunEventLog,
        SourceBindings,
        NotificationStore,
        PolicyBindings,
        RunKeys,
        PathClaims,
    ]:
        return (
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
            backend,
        )
