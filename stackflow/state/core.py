"""The SQL core of the state backend: engine, transactions, dialect hooks, schema
migration, blobs (:class:`~stackflow.state.protocols.BlobStore`)."""

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
    SchemaError,
    SpecError,
)
from stackflow.core.refs import StackRef
from stackflow.engine.spec import load_stored_spec
from stackflow.model.spec import Spec
from stackflow.state.models import (
    MIGRATIONS,
    blob_ref,
    check_ref,
    now,
    redact_url,
)
from stackflow.state.schema import (
    HEAD_REVISION,
    VERSION_TABLE,
    blobs,
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
