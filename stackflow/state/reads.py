"""Reading releases, resource state and the lock
(:class:`~stackflow.state.protocols.ReleaseReader`)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stackflow.errors import (
    NotFoundError,
)
from stackflow.release import Approval, Operation, Phase, Release, State
from stackflow.spec import Resource
from stackflow.state.core import SqlCore
from stackflow.state.models import (
    CHUNK,
    StackLock,
    as_utc,
)
from stackflow.state.schema import (
    release_resources,
    releases,
    stack_locks,
)


class ReleaseReads(SqlCore):
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
            created_at=as_utc(row.created_at),
            modified_at=as_utc(row.modified_at),
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
            acquired_at=as_utc(row.acquired_at),
        )
