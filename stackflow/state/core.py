"""The SQL core of the state backend: engine, transactions, dialect hooks, schema
migration, blobs (:class:`~stackflow.state.protocols.BlobStore`), and what more than one
store reads: a release row, its resources, the lock row and the fence on it.

Every store of the backend (:mod:`~stackflow.state.reads`, :mod:`~stackflow.state.writes`,
:mod:`~stackflow.state.records`, ...) is a mixin directly on :class:`SqlCore` and uses
nothing of another store; :class:`~stackflow.state.backend.StateBackend` is their sum."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from stackflow.core.crypto import KeyRing
from stackflow.core.errors import (
    BackendUnavailableError,
    FencedError,
    SchemaError,
    SpecError,
)
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.spec import load_stored_spec
from stackflow.model.policy import PolicyDecision
from stackflow.model.release import Approval, Operation, Phase, Release, State
from stackflow.model.source import SourceRef
from stackflow.model.spec import Resource, Spec
from stackflow.state.models import (
    MIGRATIONS,
    StackLock,
    as_utc,
    blob_ref,
    check_ref,
    now,
    redact_url,
)
from stackflow.state.schema import (
    HEAD_REVISION,
    VERSION_TABLE,
    blobs,
    release_resources,
    releases,
    stack_locks,
)
from stackflow.state.sealing import Sealer


class SqlCore:
    """One SQL engine, its transactions and dialect hooks, the schema's lifecycle and the
    content-addressed blobs: what every part of the backend builds on."""

    dialect = "sql"

    def __init__(self, url: str, engine: Engine, keys: KeyRing | None = None) -> None:
        self.url = url
        self.engine = engine
        self.keys = keys
        self.sealer = Sealer(keys)
        """Sensitive values are sealed before they are stored (with keys configured)."""

    # ---- dialect hooks ---------------------------------------------------------------------

    def _insert(self, table: sa.Table) -> Any:
        raise NotImplementedError

    def _lock_row(self, conn: Connection, stack: StackRef, *, share: bool) -> Any:
        """The stack's lock row, locked for the rest of the transaction where the engine can."""
        query = sa.select(stack_locks).where(*self._where_stack(stack_locks, stack))
        return conn.execute(query.with_for_update(read=share)).first()

    @staticmethod
    def _where_stack(table: sa.Table, stack: StackRef) -> list[Any]:
        """The rows of ``table`` that belong to ``stack``."""
        return [table.c.project == stack.project, table.c.workspace == stack.workspace]

    @contextmanager
    def _migration_guard(self, conn: Connection) -> Iterator[None]:
        yield

    @contextmanager
    def _run_lock(self, conn: Connection, run_id: str) -> Iterator[None]:
        """Serialise the writers of one key (a run's appends, a project's notification
        destinations) until commit (SQLite: the write transaction already does)."""
        yield

    # ---- rows more than one store reads ----------------------------------------------------

    @classmethod
    def _where_release(cls, stack: StackRef, revision: int) -> list[Any]:
        return [*cls._where_stack(releases, stack), releases.c.revision == revision]

    @classmethod
    def _where_state(cls, stack: StackRef, revision: int) -> list[Any]:
        t = release_resources
        return [*cls._where_stack(t, stack), t.c.revision == revision]

    def _release(self, conn: Connection, row: Any, *, with_spec: bool, with_state: bool) -> Release:
        release = Release(
            project=row.project,
            workspace=row.workspace,
            revision=row.revision,
            stack=row.stack,
            operation=Operation(row.operation),
            phase=Phase(row.phase),
            spec_ref=row.spec_ref,
            error=row.error,
            approval=Approval.model_validate(row.approval) if row.approval else None,
            changes=row.changes,
            workflow_id=row.workflow_id,
            run_id=row.run_id,
            created_at=as_utc(row.created_at),
            modified_at=as_utc(row.modified_at),
            source_revision=row.source_revision,
            source=SourceRef.model_validate(row.source) if row.source else None,
            policy=PolicyDecision.model_validate(row.policy) if row.policy else None,
            set_run=row.set_run,
        )
        if with_spec and row.spec_ref:
            release.spec = self.get_spec(row.spec_ref)
        if with_state:
            resources = self._resources(conn, release.stack_ref, release.revision)
            release.state = State(resources=list(resources))
        else:
            release.resource_count = self._count(conn, release.stack_ref, release.revision)
        return release

    def _resources(self, conn: Connection, stack: StackRef, revision: int) -> Iterator[Resource]:
        t = release_resources.c
        query = (
            sa.select(t.body)
            .where(*self._where_state(stack, revision))
            .order_by(t.position, t.resource_id)
        )
        for row in conn.execute(query):
            yield self.sealer.open(stack, row.body)

    def _count(self, conn: Connection, stack: StackRef, revision: int) -> int:
        query = sa.select(sa.func.count()).where(*self._where_state(stack, revision))
        return int(conn.execute(query).scalar_one())

    @staticmethod
    def _lock_model(row: Any) -> StackLock:
        return StackLock(
            project=row.project,
            workspace=row.workspace,
            revision=row.revision,
            operation=Operation(row.operation),
            workflow_id=row.workflow_id,
            run_id=row.run_id,
            acquired_at=as_utc(row.acquired_at),
        )

    def _fence(
        self,
        conn: Connection,
        stack: StackRef,
        revision: int,
        run: RunRef | None,
        *,
        share: bool,
    ) -> None:
        """Refuse the write unless ``run`` holds the stack for ``revision``."""
        row = self._lock_row(conn, stack, share=share)
        lock = None if row is None else self._lock_model(row)
        if lock is None or lock.revision != revision or not lock.held_by(run):
            held = "nobody" if lock is None else lock.describe()
            raise FencedError(
                f"write to {stack} release {revision} by "
                f"{run or 'an unnamed writer'} refused: the stack is held by {held}"
            )

    # ---- lifecycle -------------------------------------------------------------------------

    @contextmanager
    def _tx(self, write: bool = False) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                if write:
                    conn = conn.execution_options(stackflow_write=True)
                with conn.begin():
                    yield conn
        except sa.exc.OperationalError as err:
            raise BackendUnavailableError(
                f"state backend {redact_url(self.url)} unavailable: "
                f"{' '.join(str(err.orig).split())[:300]}"
            ) from err

    def head_revision(self) -> str:
        """The newest migration (``HEAD_REVISION``; a test holds it to Alembic's head)."""
        return HEAD_REVISION

    def schema_revision(self) -> str | None:
        """The migration the database is at (Alembic's ``alembic_version`` table), None for
        an empty database; read with one query, without loading Alembic."""
        with self._tx() as conn:
            if not sa.inspect(conn).has_table(VERSION_TABLE):
                return None
            rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        return str(rows[0][0]) if len(rows) == 1 else None

    def migrate(self) -> str:
        """Bring the schema to the newest migration (idempotent, safe from many processes).
        A database already at the head is left alone without loading Alembic (every CLI
        command on an embedded SQLite backend opens it this way)."""
        if self.schema_revision() == HEAD_REVISION:
            return HEAD_REVISION
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self._tx(write=True) as conn, self._migration_guard(conn):
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
        return self.head_revision()

    def check_schema(self) -> None:
        current = self.schema_revision()
        if current != self.head_revision():
            raise SchemaError(
                f"state backend {redact_url(self.url)} is at schema {current or 'none'}, "
                f"this stackflow needs {self.head_revision()}: run `stackflow state migrate`"
            )

    def close(self) -> None:
        self.engine.dispose()

    # ---- blobs -----------------------------------------------------------------------------

    def put_blob(self, kind: str, body: bytes) -> str:
        """Store ``body`` once under its sha256; the same bytes always give the same ref."""
        ref = blob_ref(body)
        stored, key_id = zlib.compress(body, 6), None
        if self.keys is not None:  # specs carry context.env and Secret data: sealed at rest
            key_id, stored = self.keys.encrypt(stored, ref.encode())
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(blobs)
                .values(
                    ref=ref,
                    kind=kind,
                    size=len(body),
                    body=stored,
                    key_id=key_id,
                    created_at=now(),
                )
                .on_conflict_do_nothing()
            )
        return ref

    def get_blob(self, kind: str, ref: str) -> bytes:
        """The bytes of ``ref``; the hash is checked on every read."""
        check_ref(ref, kind)
        with self._tx() as conn:
            row = conn.execute(
                sa.select(blobs.c.body, blobs.c.key_id).where(blobs.c.ref == ref)
            ).first()
        if row is None:
            raise SpecError(f"{kind} {ref}: not found in the state backend")
        stored = row.body
        if row.key_id is not None:
            if self.keys is None:
                raise SpecError(
                    f"{kind} {ref} is encrypted and this process has no keys: set "
                    "STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE"
                )
            stored = self.keys.decrypt(row.key_id, stored, ref.encode(), what=f"{kind} {ref}")
        body = zlib.decompress(stored)
        if blob_ref(body) != ref:
            raise SpecError(f"{kind} {ref}: stored bytes do not match their hash (corrupted)")
        return body

    def put_spec(self, spec: Spec) -> str:
        data = spec.model_dump(mode="json", by_alias=True)
        body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return self.put_blob("spec_ref", body)

    def get_spec(self, ref: str) -> Spec:
        return load_stored_spec(json.loads(self.get_blob("spec_ref", ref)), source=ref)
