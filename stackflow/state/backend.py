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

import builtins
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection, Engine

from stackflow.crypto import KeyRing
from stackflow.drift import DriftReport, DriftSummary
from stackflow.errors import (
    BackendUnavailableError,
    ConflictError,
    FencedError,
    NotFoundError,
    PhaseConflictError,
    SchemaError,
    SpecError,
    StackLockedError,
)
from stackflow.release import Approval, Operation, Phase, Release, State
from stackflow.spec import Resource, Spec, parse_spec
from stackflow.state.schema import (
    blobs,
    drift_reports,
    release_resources,
    releases,
    stack_locks,
    terraform_states,
)
from stackflow.state.sealing import Sealer

log = logging.getLogger(__name__)

REF_PREFIX = "sha256:"
MIGRATIONS = Path(__file__).with_name("migrations")
CHUNK = 500
"""Rows one statement names at most (``IN`` lists, multi-row upserts)."""


def now() -> datetime:
    return datetime.now(UTC)


def _utc(value: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RunRef:
    """A Temporal run: the only kind of writer that may hold a stack."""

    workflow_id: str
    run_id: str

    def __str__(self) -> str:
        return f"run {self.run_id} of workflow {self.workflow_id}"


class StackLock(BaseModel):
    """Who holds a stack: the release in progress and the run that writes it."""

    project: str
    workspace: str
    revision: int
    operation: Operation
    workflow_id: str | None = None
    run_id: str | None = None
    acquired_at: datetime

    def held_by(self, run: RunRef | None) -> bool:
        if run is None:
            return self.run_id is None
        return self.run_id == run.run_id and self.workflow_id == run.workflow_id

    def holder(self) -> RunRef | None:
        if self.workflow_id is None or self.run_id is None:
            return None
        return RunRef(self.workflow_id, self.run_id)

    def describe(self) -> str:
        who = str(self.holder()) if self.holder() else "no recorded run"
        return f"release {self.revision} ({self.operation}) held by {who}"


def blob_ref(body: bytes) -> str:
    return REF_PREFIX + hashlib.sha256(body).hexdigest()


def check_ref(ref: str, kind: str) -> str:
    digest = ref[len(REF_PREFIX) :] if ref.startswith(REF_PREFIX) else ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise SpecError(f"{kind} {ref!r}: expected 'sha256:<64 hex digits>'")
    return ref


def default_state_url() -> str:
    """``$STACKFLOW_STATE_URL``, else SQLite at ``$STACKFLOW_HOME/state.db``."""
    url = os.environ.get("STACKFLOW_STATE_URL")
    if url:
        return url
    home = os.environ.get("STACKFLOW_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".stackflow"
    return f"sqlite:///{root / 'state.db'}"


def redact_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<invalid url>"


class StateBackend:
    """Everything stackflow stores, on one SQL engine. Thread-safe; every method is sync."""

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

    def _lock_row(self, conn: Connection, project: str, workspace: str, *, share: bool) -> Any:
        """The stack's lock row, locked for the rest of the transaction where the engine can."""
        query = sa.select(stack_locks).where(
            stack_locks.c.project == project, stack_locks.c.workspace == workspace
        )
        return conn.execute(query.with_for_update(read=share)).first()

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
        from alembic.script import ScriptDirectory  # alembic only when the schema is checked

        script = ScriptDirectory(str(MIGRATIONS))
        head = script.get_current_head()
        assert head is not None
        return head

    def schema_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self._tx() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def migrate(self) -> str:
        """Bring the schema to the newest migration (idempotent, safe from many processes)."""
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
        return parse_spec(json.loads(self.get_blob("spec_ref", ref)), source=ref)

    # ---- release reads ---------------------------------------------------------------------

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
            created_at=_utc(row.created_at),
            modified_at=_utc(row.modified_at),
            source_revision=row.source_revision,
        )
        if with_spec and row.spec_ref:
            release.spec = self.get_spec(row.spec_ref)
        if with_state:
            release.state = State(
                resources=list(self._resources(conn, row.project, row.workspace, row.revision))
            )
        else:
            release.resource_count = self._count(conn, row.project, row.workspace, row.revision)
        return release

    @staticmethod
    def _where_release(project: str, workspace: str, revision: int) -> list[Any]:
        return [
            releases.c.project == project,
            releases.c.workspace == workspace,
            releases.c.revision == revision,
        ]

    @staticmethod
    def _where_state(project: str, workspace: str, revision: int) -> list[Any]:
        t = release_resources.c
        return [t.project == project, t.workspace == workspace, t.revision == revision]

    def _resources(
        self, conn: Connection, project: str, workspace: str, revision: int
    ) -> Iterator[Resource]:
        t = release_resources.c
        query = (
            sa.select(t.body)
            .where(*self._where_state(project, workspace, revision))
            .order_by(t.position, t.resource_id)
        )
        for row in conn.execute(query):
            yield self.sealer.open(project, workspace, row.body)

    def _count(self, conn: Connection, project: str, workspace: str, revision: int) -> int:
        query = sa.select(sa.func.count()).where(*self._where_state(project, workspace, revision))
        return int(conn.execute(query).scalar_one())

    def get(
        self,
        project: str,
        workspace: str,
        revision: int,
        *,
        with_spec: bool = True,
        with_state: bool = True,
    ) -> Release:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(releases).where(*self._where_release(project, workspace, revision))
            ).first()
            if row is None:
                raise NotFoundError(f"release {project}/{workspace}/{revision} not found")
            return self._release(conn, row, with_spec=with_spec, with_state=with_state)

    def revisions(self, project: str, workspace: str) -> builtins.list[int]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases.c.revision)
                .where(releases.c.project == project, releases.c.workspace == workspace)
                .order_by(releases.c.revision)
            )
            return [r.revision for r in rows]

    def list(
        self, project: str, workspace: str, *, with_state: bool = False
    ) -> builtins.list[Release]:
        """Every release of the stack by revision, without specs (and states unless asked;
        ``resource_count`` is set instead)."""
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases)
                .where(releases.c.project == project, releases.c.workspace == workspace)
                .order_by(releases.c.revision)
            ).all()
            return [self._release(conn, r, with_spec=False, with_state=with_state) for r in rows]

    def stacks(self) -> builtins.list[tuple[str, str]]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases.c.project, releases.c.workspace)
                .distinct()
                .order_by(releases.c.project, releases.c.workspace)
            )
            return [(r.project, r.workspace) for r in rows]

    def latest(self, project: str, workspace: str, *, with_spec: bool = True) -> Release | None:
        revisions = self.revisions(project, workspace)
        if not revisions:
            return None
        return self.get(project, workspace, revisions[-1], with_spec=with_spec)

    def phase_of(self, project: str, workspace: str, revision: int) -> Phase:
        with self._tx() as conn:
            phase = conn.execute(
                sa.select(releases.c.phase).where(
                    *self._where_release(project, workspace, revision)
                )
            ).scalar()
        if phase is None:
            raise NotFoundError(f"release {project}/{workspace}/{revision} not found")
        return Phase(phase)

    def latest_succeeded_revision(self, project: str, workspace: str) -> int | None:
        with self._tx() as conn:
            value = conn.execute(
                sa.select(sa.func.max(releases.c.revision)).where(
                    releases.c.project == project,
                    releases.c.workspace == workspace,
                    releases.c.phase == Phase.succeeded.value,
                )
            ).scalar()
        return None if value is None else int(value)

    def latest_succeeded(self, project: str, workspace: str) -> Release | None:
        revision = self.latest_succeeded_revision(project, workspace)
        return None if revision is None else self.get(project, workspace, revision)

    def latest_spec_ref(self, project: str, workspace: str) -> str | None:
        """The spec of the stack's latest release that has one."""
        with self._tx() as conn:
            return conn.execute(
                sa.select(releases.c.spec_ref)
                .where(
                    releases.c.project == project,
                    releases.c.workspace == workspace,
                    releases.c.spec_ref.is_not(None),
                )
                .order_by(releases.c.revision.desc())
                .limit(1)
            ).scalar()

    def resources(
        self, project: str, workspace: str, revision: int, ids: Iterable[str] | None = None
    ) -> dict[str, Resource]:
        """The recorded state of the given resources (all when None) in a release, by id."""
        t = release_resources.c
        where = self._where_state(project, workspace, revision)
        with self._tx() as conn:
            if ids is None:
                return {r.id: r for r in self._resources(conn, project, workspace, revision)}
            wanted = builtins.list(dict.fromkeys(ids))
            found: dict[str, Resource] = {}
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                for row in conn.execute(sa.select(t.body).where(*where, t.resource_id.in_(chunk))):
                    resource = self.sealer.open(project, workspace, row.body)
                    found[resource.id] = resource
            return found

    def resource_state(
        self, project: str, workspace: str, revision: int, resource_id: str
    ) -> Resource | None:
        return self.resources(project, workspace, revision, [resource_id]).get(resource_id)

    def lock(self, project: str, workspace: str) -> StackLock | None:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(stack_locks).where(
                    stack_locks.c.project == project, stack_locks.c.workspace == workspace
                )
            ).first()
        return None if row is None else self._lock_model(row)

    @staticmethod
    def _lock_model(row: Any) -> StackLock:
        return StackLock(
            project=row.project,
            workspace=row.workspace,
            revision=row.revision,
            operation=Operation(row.operation),
            workflow_id=row.workflow_id,
            run_id=row.run_id,
            acquired_at=_utc(row.acquired_at),
        )

    # ---- release writes --------------------------------------------------------------------

    def create(
        self,
        project: str,
        workspace: str,
        operation: Operation,
        spec: Spec | None = None,
        *,
        spec_ref: str | None = None,
        run: RunRef | None = None,
        source_revision: int | None = None,
    ) -> Release:
        """Take the stack's lock for ``run`` and open the next revision, whose state starts as
        a copy of the latest release's (whatever its phase). StackLockedError while another
        run holds the stack; nothing is written then. ``source_revision``: the release a
        rollback restores."""
        if spec is not None and spec_ref is None:
            spec_ref = self.put_spec(spec)
        stamp = now()
        with self._tx(write=True) as conn:
            taken = conn.execute(
                self._insert(stack_locks)
                .values(
                    project=project,
                    workspace=workspace,
                    revision=0,
                    operation=operation.value,
                    workflow_id=run.workflow_id if run else None,
                    run_id=run.run_id if run else None,
                    acquired_at=stamp,
                )
                .on_conflict_do_nothing()
                .returning(stack_locks.c.project)  # rowcount is not reliable on every driver
            ).first()
            if taken is None:
                holder = self._lock_row(conn, project, workspace, share=True)
                raise StackLockedError(self._locked_message(project, workspace, holder))
            previous = conn.execute(
                sa.select(sa.func.max(releases.c.revision)).where(
                    releases.c.project == project, releases.c.workspace == workspace
                )
            ).scalar()
            revision = int(previous or 0) + 1
            conn.execute(
                stack_locks.update()
                .where(stack_locks.c.project == project, stack_locks.c.workspace == workspace)
                .values(revision=revision)
            )
            conn.execute(
                releases.insert().values(
                    project=project,
                    workspace=workspace,
                    revision=revision,
                    operation=operation.value,
                    phase=Phase.generating.value,
                    spec_ref=spec_ref,
                    workflow_id=run.workflow_id if run else None,
                    run_id=run.run_id if run else None,
                    created_at=stamp,
                    modified_at=stamp,
                    source_revision=source_revision,
                )
            )
            if previous is not None:
                t = release_resources.c
                conn.execute(
                    release_resources.insert().from_select(
                        ["project", "workspace", "revision", "resource_id", "position", "body"],
                        sa.select(
                            t.project,
                            t.workspace,
                            sa.literal(revision),
                            t.resource_id,
                            t.position,
                            t.body,
                        ).where(*self._where_state(project, workspace, int(previous))),
                    )
                )
            row = conn.execute(
                sa.select(releases).where(*self._where_release(project, workspace, revision))
            ).one()
            release = self._release(conn, row, with_spec=False, with_state=True)
        release.spec = spec
        return release

    @staticmethod
    def _locked_message(project: str, workspace: str, holder: Any) -> str:
        what = (
            "another operation" if holder is None else StateBackend._lock_model(holder).describe()
        )
        return (
            f"stack {project}/{workspace} is locked: {what}; it is released when that run "
            f"ends (a run that ended without releasing it is recovered by the next "
            f"operation); to force it: stackflow release unlock --project {project} "
            f"--workspace {workspace}"
        )

    def _fence(
        self,
        conn: Connection,
        project: str,
        workspace: str,
        revision: int,
        run: RunRef | None,
        *,
        share: bool,
    ) -> None:
        """Refuse the write unless ``run`` holds the stack for ``revision``."""
        row = self._lock_row(conn, project, workspace, share=share)
        lock = None if row is None else self._lock_model(row)
        if lock is None or lock.revision != revision or not lock.held_by(run):
            held = "nobody" if lock is None else lock.describe()
            raise FencedError(
                f"write to {project}/{workspace} release {revision} by "
                f"{run or 'an unnamed writer'} refused: the stack is held by {held}"
            )

    def assert_holds(self, project: str, workspace: str, revision: int, run: RunRef | None) -> None:
        """FencedError unless ``run`` holds the stack for ``revision`` (checked before a
        runtime call, so a run that lost the stack changes nothing outside either)."""
        with self._tx() as conn:
            self._fence(conn, project, workspace, revision, run, share=True)

    def set_phase(
        self,
        project: str,
        workspace: str,
        revision: int,
        phase: Phase,
        *,
        run: RunRef | None = None,
        error: str | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
    ) -> Release:
        """Move a release to ``phase`` (fenced on ``run``); a final phase releases the lock.

        Setting the final phase a release already has is a no-op; leaving one is refused.
        Returns the release without its spec and state.
        """
        with self._tx(write=True) as conn:
            row = conn.execute(
                sa.select(releases).where(*self._where_release(project, workspace, revision))
            ).first()
            if row is None:
                raise NotFoundError(f"release {project}/{workspace}/{revision} not found")
            current = Phase(row.phase)
            if current.is_final:
                if current is phase:
                    return self._release(conn, row, with_spec=False, with_state=False)
                raise PhaseConflictError(
                    f"release {revision} of {project}/{workspace} is {current} and cannot "
                    f"become {phase}"
                )
            self._fence(conn, project, workspace, revision, run, share=False)
            values: dict[str, Any] = {"phase": phase.value, "modified_at": now()}
            if error is not None:
                values["error"] = error
            if changes is not None:
                values["changes"] = changes
            if approval is not None:
                values["approval"] = approval.model_dump(mode="json")
            conn.execute(
                releases.update()
                .where(*self._where_release(project, workspace, revision))
                .values(**values)
            )
            if phase.is_final:
                self._release_lock(conn, project, workspace)
            row = conn.execute(
                sa.select(releases).where(*self._where_release(project, workspace, revision))
            ).one()
            return self._release(conn, row, with_spec=False, with_state=False)

    @staticmethod
    def _release_lock(conn: Connection, project: str, workspace: str) -> None:
        conn.execute(
            stack_locks.delete().where(
                stack_locks.c.project == project, stack_locks.c.workspace == workspace
            )
        )

    def record_resource(
        self,
        project: str,
        workspace: str,
        revision: int,
        resource: Resource,
        *,
        run: RunRef | None = None,
    ) -> None:
        """Record one applied resource's state in the release (fenced on ``run``)."""
        self.record_resources(project, workspace, revision, [resource], run=run)

    def record_resources(
        self,
        project: str,
        workspace: str,
        revision: int,
        resources: Iterable[Resource],
        *,
        run: RunRef | None = None,
    ) -> None:
        """Record applied resources' state in the release, in one transaction (fenced on
        ``run``): an upsert each, new ones appended in the order given."""
        t = release_resources.c
        bodies = [(r.id, self.sealer.seal(project, workspace, revision, r)) for r in resources]
        if not bodies:
            return
        with self._tx(write=True) as conn:
            self._fence(conn, project, workspace, revision, run, share=True)
            known = {
                row.resource_id
                for row in conn.execute(
                    sa.select(t.resource_id)
                    .where(*self._where_state(project, workspace, revision))
                    .where(t.resource_id.in_([rid for rid, _ in bodies]))
                )
            }
            for rid, body in bodies:
                if rid in known:
                    conn.execute(
                        release_resources.update()
                        .where(*self._where_state(project, workspace, revision))
                        .where(t.resource_id == rid)
                        .values(body=body)
                    )
            fresh = [(rid, body) for rid, body in bodies if rid not in known]
            if not fresh:
                return
            position = conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(t.position), 0)).where(
                    *self._where_state(project, workspace, revision)
                )
            ).scalar_one()
            insert = self._insert(release_resources).values(
                [
                    {
                        "project": project,
                        "workspace": workspace,
                        "revision": revision,
                        "resource_id": rid,
                        "position": position + n,
                        "body": body,
                    }
                    for n, (rid, body) in enumerate(fresh, start=1)
                ]
            )
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["project", "workspace", "revision", "resource_id"],
                    set_={"body": insert.excluded.body},
                )
            )

    def record_deletion(
        self,
        project: str,
        workspace: str,
        revision: int,
        resource_id: str,
        *,
        run: RunRef | None = None,
    ) -> None:
        """Remove one deleted resource from the release's state (fenced; idempotent)."""
        self.record_deletions(project, workspace, revision, [resource_id], run=run)

    def record_deletions(
        self,
        project: str,
        workspace: str,
        revision: int,
        resource_ids: Iterable[str],
        *,
        run: RunRef | None = None,
    ) -> None:
        """Remove deleted resources from the release's state, in one transaction (fenced;
        idempotent)."""
        ids = list(resource_ids)
        if not ids:
            return
        with self._tx(write=True) as conn:
            self._fence(conn, project, workspace, revision, run, share=True)
            conn.execute(
                release_resources.delete()
                .where(*self._where_state(project, workspace, revision))
                .where(release_resources.c.resource_id.in_(ids))
            )

    def recover(self, holder: StackLock, reason: str) -> bool:
        """Close the release ``holder`` stands for as failed with ``reason`` and free the
        stack, if that lock is still the one held (compare-and-set). True if it was."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, holder.project, holder.workspace, share=False)
            if row is None or self._lock_model(row) != holder:
                return False
            self._fail_release(conn, holder.project, holder.workspace, holder.revision, reason)
            self._release_lock(conn, holder.project, holder.workspace)
            return True

    def _fail_release(
        self, conn: Connection, project: str, workspace: str, revision: int, reason: str
    ) -> None:
        conn.execute(
            releases.update()
            .where(*self._where_release(project, workspace, revision))
            .where(releases.c.phase.not_in([Phase.succeeded.value, Phase.failed.value]))
            .values(phase=Phase.failed.value, error=reason, modified_at=now())
        )

    def transfer(self, holder: StackLock, run: RunRef) -> bool:
        """Hand the stack from ``holder`` (a run that has closed) to ``run`` of the same
        workflow (a reset's new run); compare-and-set, True if it happened."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, holder.project, holder.workspace, share=False)
            if row is None or self._lock_model(row) != holder:
                return False
            conn.execute(
                stack_locks.update()
                .where(
                    stack_locks.c.project == holder.project,
                    stack_locks.c.workspace == holder.workspace,
                )
                .values(workflow_id=run.workflow_id, run_id=run.run_id)
            )
            conn.execute(
                releases.update()
                .where(*self._where_release(holder.project, holder.workspace, holder.revision))
                .values(workflow_id=run.workflow_id, run_id=run.run_id, modified_at=now())
            )
            return True

    def unlock(self, project: str, workspace: str, reason: str | None = None) -> Release:
        """Free the stack by hand: its release in progress becomes failed; return the latest."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, project, workspace, share=False)
            if row is not None:
                lock = self._lock_model(row)
                self._fail_release(
                    conn,
                    project,
                    workspace,
                    lock.revision,
                    reason
                    or f"unlocked by hand while {lock.operation} was in progress; the "
                    "operation may not have finished",
                )
                self._release_lock(conn, project, workspace)
        latest = self.latest(project, workspace, with_spec=False)
        if latest is None:
            raise NotFoundError(f"stack {project}/{workspace} has no releases")
        return latest

    def import_release(self, release: Release) -> Release:
        """Store a release as it is (revision, phase, times, state); ConflictError if taken.
        An imported release still in progress locks its stack with no run (unlock by hand)."""
        spec_ref = release.spec_ref
        if release.spec is not None:
            spec_ref = self.put_spec(release.spec)
        with self._tx(write=True) as conn:
            exists = conn.execute(
                sa.select(releases.c.revision).where(
                    *self._where_release(release.project, release.workspace, release.revision)
                )
            ).first()
            if exists is not None:
                raise ConflictError(
                    f"release {release.project}/{release.workspace}/{release.revision} "
                    "exists already"
                )
            conn.execute(
                releases.insert().values(
                    project=release.project,
                    workspace=release.workspace,
                    revision=release.revision,
                    operation=release.operation.value,
                    phase=release.phase.value,
                    stack=release.stack,
                    spec_ref=spec_ref,
                    error=release.error,
                    approval=release.approval.model_dump(mode="json") if release.approval else None,
                    changes=release.changes,
                    workflow_id=release.workflow_id,
                    run_id=release.run_id,
                    created_at=release.created_at.astimezone(UTC),
                    modified_at=release.modified_at.astimezone(UTC),
                    source_revision=release.source_revision,
                )
            )
            rows = [
                {
                    "project": release.project,
                    "workspace": release.workspace,
                    "revision": release.revision,
                    "resource_id": r.id,
                    "position": i,
                    "body": self.sealer.seal(
                        release.project, release.workspace, release.revision, r
                    ),
                }
                for i, r in enumerate(release.state.resources, 1)
            ]
            if rows:
                conn.execute(release_resources.insert(), rows)
            if not release.phase.is_final:
                conn.execute(
                    self._insert(stack_locks)
                    .values(
                        project=release.project,
                        workspace=release.workspace,
                        revision=release.revision,
                        operation=release.operation.value,
                        workflow_id=None,
                        run_id=None,
                        acquired_at=now(),
                    )
                    .on_conflict_do_nothing()
                )
        return release

    # ---- drift reports ---------------------------------------------------------------------

    def put_drift_report(self, report: DriftReport) -> None:
        """Keep what a drift check found (no lock: a check reads only); idempotent per
        (stack, checked_at)."""
        summary = report.summary.model_dump(mode="json")
        if report.repair_workflow_id:
            summary["repair_workflow_id"] = report.repair_workflow_id
        values = {
            "revision": report.revision,
            "drifted": report.drifted,
            "summary": summary,
            "report_ref": report.report_ref,
            "workflow_id": report.workflow_id,
            "run_id": report.run_id,
        }
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(drift_reports)
                .values(
                    project=report.project,
                    workspace=report.workspace,
                    checked_at=report.checked_at.astimezone(UTC),
                    **values,
                )
                .on_conflict_do_update(
                    index_elements=["project", "workspace", "checked_at"], set_=values
                )
            )

    def drift_reports(
        self, project: str, workspace: str, limit: int = 1
    ) -> builtins.list[DriftReport]:
        """The newest ``limit`` drift reports of a stack, newest first."""
        d = drift_reports.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(drift_reports)
                .where(d.project == project, d.workspace == workspace)
                .order_by(d.checked_at.desc())
                .limit(limit)
            ).all()
        reports = []
        for row in rows:
            summary = dict(row.summary or {})
            repair = summary.pop("repair_workflow_id", None)
            reports.append(
                DriftReport(
                    project=row.project,
                    workspace=row.workspace,
                    checked_at=_utc(row.checked_at),
                    revision=row.revision,
                    drifted=bool(row.drifted),
                    summary=DriftSummary.model_validate(summary),
                    report_ref=row.report_ref,
                    workflow_id=row.workflow_id,
                    run_id=row.run_id,
                    repair_workflow_id=repair,
                )
            )
        return reports

    # ---- Terraform state -------------------------------------------------------------------

    def put_terraform_state(
        self,
        project: str,
        workspace: str,
        resource_id: str,
        body: str,
        *,
        revision: int,
        run: RunRef | None,
    ) -> None:
        """Keep the resource's newest OpenTofu state (fenced on ``run``); an older serial of
        the same lineage never replaces a newer one."""
        self.put_terraform_states(
            project, workspace, {resource_id: body}, revision=revision, run=run
        )

    def put_terraform_states(
        self,
        project: str,
        workspace: str,
        bodies: Mapping[str, str],
        *,
        revision: int,
        run: RunRef | None,
    ) -> None:
        """:meth:`put_terraform_state` for several resources in one transaction (what one
        tofu command changed is kept all at once or not at all): per chunk of :data:`CHUNK`
        resources, one read of the serials kept and one upsert statement for its rows."""
        t = terraform_states.c
        docs = {rid: json.loads(body) for rid, body in bodies.items()}
        ids = builtins.list(docs)
        with self._tx(write=True) as conn:
            self._fence(conn, project, workspace, revision, run, share=True)
            for begin in range(0, len(ids), CHUNK):
                chunk = ids[begin : begin + CHUNK]
                query = sa.select(t.resource_id, t.serial, t.lineage).where(
                    t.project == project, t.workspace == workspace, t.resource_id.in_(chunk)
                )
                kept = {row.resource_id: row for row in conn.execute(query)}
                rows = []
                for rid in chunk:
                    doc = docs[rid]
                    serial, lineage = int(doc.get("serial", 0)), str(doc.get("lineage", ""))
                    row = kept.get(rid)
                    if row is not None and row.lineage == lineage and row.serial > serial:
                        continue  # an older serial of the same lineage never replaces a newer
                    rows.append(
                        {
                            "project": project,
                            "workspace": workspace,
                            "resource_id": rid,
                            "body": self.sealer.seal_text(
                                bodies[rid], project, workspace, rid, "tfstate"
                            ),
                            "serial": serial,
                            "lineage": lineage,
                            "revision": revision,
                            "run_id": run.run_id if run else None,
                            "updated_at": now(),
                        }
                    )
                if not rows:
                    continue
                upsert = self._insert(terraform_states)
                changed = ("body", "serial", "lineage", "revision", "run_id", "updated_at")
                conn.execute(
                    upsert.on_conflict_do_update(
                        index_elements=["project", "workspace", "resource_id"],
                        set_={name: upsert.excluded[name] for name in changed},
                    ),
                    rows,
                )

    def get_terraform_state(self, project: str, workspace: str, resource_id: str) -> str | None:
        return self.get_terraform_states(project, workspace, [resource_id]).get(resource_id)

    def get_terraform_states(
        self, project: str, workspace: str, resource_ids: Iterable[str]
    ) -> dict[str, str]:
        """The kept OpenTofu states of several resources, read in one transaction (a
        resource with none is left out)."""
        t = terraform_states.c
        wanted = builtins.list(dict.fromkeys(resource_ids))
        stored: dict[str, str] = {}
        with self._tx() as conn:
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                query = sa.select(t.resource_id, t.body).where(
                    t.project == project, t.workspace == workspace, t.resource_id.in_(chunk)
                )
                stored.update({row.resource_id: row.body for row in conn.execute(query)})
        return {
            rid: self.sealer.open_text(body, project, workspace, rid, "tfstate")
            for rid, body in stored.items()
        }

    def delete_terraform_state(
        self, project: str, workspace: str, resource_id: str, *, revision: int, run: RunRef | None
    ) -> None:
        t = terraform_states.c
        with self._tx(write=True) as conn:
            self._fence(conn, project, workspace, revision, run, share=True)
            conn.execute(
                terraform_states.delete().where(
                    t.project == project, t.workspace == workspace, t.resource_id == resource_id
                )
            )


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
