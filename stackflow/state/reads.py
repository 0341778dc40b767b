"""Reading releases, resource state and the lock
(:class:`~stackflow.state.protocols.ReleaseReader`)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable

import sqlalchemy as sa

from stackflow.core.errors import (
    NotFoundError,
)
from stackflow.core.refs import StackRef
from stackflow.model.release import Phase, Release
from stackflow.model.spec import Resource
from stackflow.state.core import SqlCore
from stackflow.state.models import (
    CHUNK,
    StackLock,
)
from stackflow.state.schema import (
    release_resources,
    releases,
    stack_locks,
)


class ReleaseReads(SqlCore):
    """Releases, their resources' state and the stack's lock, as recorded."""

    def get(
        self,
        stack: StackRef,
        revision: int,
        *,
        with_spec: bool = True,
        with_state: bool = True,
    ) -> Release:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(releases).where(*self._where_release(stack, revision))
            ).first()
            if row is None:
                raise NotFoundError(f"release {stack}/{revision} not found")
            return self._release(conn, row, with_spec=with_spec, with_state=with_state)

    def revisions(self, stack: StackRef) -> builtins.list[int]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases.c.revision)
                .where(*self._where_stack(releases, stack))
                .order_by(releases.c.revision)
            )
            return [r.revision for r in rows]

    def list(self, stack: StackRef, *, with_state: bool = False) -> builtins.list[Release]:
        """Every release of the stack by revision, without specs (and states unless asked;
        ``resource_count`` is set instead)."""
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases)
                .where(*self._where_stack(releases, stack))
                .order_by(releases.c.revision)
            ).all()
            return [self._release(conn, r, with_spec=False, with_state=with_state) for r in rows]

    def stacks(self) -> builtins.list[StackRef]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(releases.c.project, releases.c.workspace)
                .distinct()
                .order_by(releases.c.project, releases.c.workspace)
            )
            return [StackRef(r.project, r.workspace) for r in rows]

    def latest(self, stack: StackRef, *, with_spec: bool = True) -> Release | None:
        revisions = self.revisions(stack)
        if not revisions:
            return None
        return self.get(stack, revisions[-1], with_spec=with_spec)

    def phase_of(self, stack: StackRef, revision: int) -> Phase:
        with self._tx() as conn:
            phase = conn.execute(
                sa.select(releases.c.phase).where(*self._where_release(stack, revision))
            ).scalar()
        if phase is None:
            raise NotFoundError(f"release {stack}/{revision} not found")
        return Phase(phase)

    def latest_succeeded_revision(self, stack: StackRef) -> int | None:
        with self._tx() as conn:
            value = conn.execute(
                sa.select(sa.func.max(releases.c.revision)).where(
                    *self._where_stack(releases, stack),
                    releases.c.phase == Phase.succeeded.value,
                )
            ).scalar()
        return None if value is None else int(value)

    def latest_succeeded(self, stack: StackRef) -> Release | None:
        revision = self.latest_succeeded_revision(stack)
        return None if revision is None else self.get(stack, revision)

    def latest_spec_ref(self, stack: StackRef) -> str | None:
        """The spec of the stack's latest release that has one."""
        with self._tx() as conn:
            return conn.execute(
                sa.select(releases.c.spec_ref)
                .where(*self._where_stack(releases, stack), releases.c.spec_ref.is_not(None))
                .order_by(releases.c.revision.desc())
                .limit(1)
            ).scalar()

    def resources(
        self, stack: StackRef, revision: int, ids: Iterable[str] | None = None
    ) -> dict[str, Resource]:
        """The recorded state of the given resources (all when None) in a release, by id."""
        t = release_resources.c
        where = self._where_state(stack, revision)
        with self._tx() as conn:
            if ids is None:
                return {r.id: r for r in self._resources(conn, stack, revision)}
            wanted = builtins.list(dict.fromkeys(ids))
            found: dict[str, Resource] = {}
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                for row in conn.execute(sa.select(t.body).where(*where, t.resource_id.in_(chunk))):
                    resource = self.sealer.open(stack, row.body)
                    found[resource.id] = resource
            return found

    def resource_ids(self, stack: StackRef, revision: int) -> builtins.list[str]:
        """The ids of every resource of a release's state, in the state's order (no body is
        read: what a plan needs to know of a large state before it reads a few)."""
        t = release_resources.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.resource_id)
                .where(*self._where_state(stack, revision))
                .order_by(t.position, t.resource_id)
            )
            return [row.resource_id for row in rows]

    def sealed_resources(self, stack: StackRef, revision: int) -> dict[str, str]:
        """The recorded state of every resource of a release as stored: each resource's JSON
        body by id, sensitive values still sealed (:meth:`Sealer.open` reads one). What a
        copy of the state needs (the prior-state cache) without opening and sealing again."""
        t = release_resources.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.resource_id, t.body)
                .where(*self._where_state(stack, revision))
                .order_by(t.position, t.resource_id)
            )
            return {row.resource_id: row.body for row in rows}

    def resource_state(self, stack: StackRef, revision: int, resource_id: str) -> Resource | None:
        return self.resources(stack, revision, [resource_id]).get(resource_id)

    def lock(self, stack: StackRef) -> StackLock | None:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(stack_locks).where(*self._where_stack(stack_locks, stack))
            ).first()
        return None if row is None else self._lock_model(row)
