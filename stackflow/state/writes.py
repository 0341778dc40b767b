"""Writing releases and resource state under the stack lock: create (takes the lock),
fenced writes (compare-and-set on the holding run), phases, recovery, transfer, unlock,
import (:class:`~stackflow.state.protocols.ReleaseWriter` and
:class:`~stackflow.state.protocols.StackLocks`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stackflow.core.errors import (
    ConflictError,
    NotFoundError,
    PhaseConflictError,
    StackLockedError,
)
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.policy import PolicyDecision
from stackflow.model.release import Approval, Operation, Phase, Release
from stackflow.model.source import SourceRef
from stackflow.model.spec import Resource, Spec
from stackflow.state.core import SqlCore
from stackflow.state.models import (
    StackLock,
    now,
)
from stackflow.state.schema import (
    release_resources,
    releases,
    stack_locks,
    terraform_plans,
)


class ReleaseWrites(SqlCore):
    """The stack lock and the fenced writes to the release it holds."""

    def create(
        self,
        stack: StackRef,
        operation: Operation,
        spec: Spec | None = None,
        *,
        spec_ref: str | None = None,
        run: RunRef | None = None,
        source_revision: int | None = None,
        source: SourceRef | None = None,
        set_run: str | None = None,
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
                    project=stack.project,
                    workspace=stack.workspace,
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
                holder = self._lock_row(conn, stack, share=True)
                raise StackLockedError(self._locked_message(stack, holder))
            previous = conn.execute(
                sa.select(sa.func.max(releases.c.revision)).where(
                    *self._where_stack(releases, stack)
                )
            ).scalar()
            revision = int(previous or 0) + 1
            conn.execute(
                stack_locks.update()
                .where(*self._where_stack(stack_locks, stack))
                .values(revision=revision)
            )
            conn.execute(
                releases.insert().values(
                    project=stack.project,
                    workspace=stack.workspace,
                    revision=revision,
                    operation=operation.value,
                    phase=Phase.generating.value,
                    spec_ref=spec_ref,
                    workflow_id=run.workflow_id if run else None,
                    run_id=run.run_id if run else None,
                    created_at=stamp,
                    modified_at=stamp,
                    source_revision=source_revision,
                    source=source.model_dump(mode="json") if source else None,
                    set_run=set_run,
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
                        ).where(*self._where_state(stack, int(previous))),
                    )
                )
            row = conn.execute(
                sa.select(releases).where(*self._where_release(stack, revision))
            ).one()
            release = self._release(conn, row, with_spec=False, with_state=True)
        release.spec = spec
        return release

    @staticmethod
    def _locked_message(stack: StackRef, holder: Any) -> str:
        what = "another operation" if holder is None else SqlCore._lock_model(holder).describe()
        return (
            f"stack {stack} is locked: {what}; it is released when that run ends (a run that "
            f"ended without releasing it is recovered by the next operation); to force it: "
            f"stackflow release unlock {stack.cli_flags}"
        )

    def assert_holds(self, stack: StackRef, revision: int, run: RunRef | None) -> None:
        """FencedError unless ``run`` holds the stack for ``revision`` (checked before a
        runtime call, so a run that lost the stack changes nothing outside either)."""
        with self._tx() as conn:
            self._fence(conn, stack, revision, run, share=True)

    def set_phase(
        self,
        stack: StackRef,
        revision: int,
        phase: Phase,
        *,
        run: RunRef | None = None,
        error: str | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
        policy: PolicyDecision | None = None,
    ) -> Release:
        """Move a release to ``phase`` (fenced on ``run``); a final phase releases the lock.

        Setting the final phase a release already has is a no-op; leaving one is refused.
        Returns the release without its spec and state. A run's waits (awaiting approval or a
        decision) are not release phases: refused.
        """
        if not phase.is_stored:
            raise PhaseConflictError(f"{phase} is a run's wait, not a phase a release records")
        with self._tx(write=True) as conn:
            row = conn.execute(
                sa.select(releases).where(*self._where_release(stack, revision))
            ).first()
            if row is None:
                raise NotFoundError(f"release {stack}/{revision} not found")
            current = Phase(row.phase)
            if current.is_final:
                if current is phase:
                    return self._release(conn, row, with_spec=False, with_state=False)
                raise PhaseConflictError(
                    f"release {revision} of {stack} is {current} and cannot become {phase}"
                )
            self._fence(conn, stack, revision, run, share=False)
            values: dict[str, Any] = {"phase": phase.value, "modified_at": now()}
            if error is not None:
                values["error"] = error
            if changes is not None:
                values["changes"] = changes
            if approval is not None:
                values["approval"] = approval.model_dump(mode="json")
            if policy is not None:
                values["policy"] = policy.model_dump(mode="json")
            conn.execute(
                releases.update().where(*self._where_release(stack, revision)).values(**values)
            )
            if phase.is_final:
                self._release_lock(conn, stack)
            row = conn.execute(
                sa.select(releases).where(*self._where_release(stack, revision))
            ).one()
            return self._release(conn, row, with_spec=False, with_state=False)

    @classmethod
    def _release_lock(cls, conn: Connection, stack: StackRef) -> None:
        conn.execute(stack_locks.delete().where(*cls._where_stack(stack_locks, stack)))
        # the plans an apply's preview kept were for the release that held the lock: it ended
        conn.execute(terraform_plans.delete().where(*cls._where_stack(terraform_plans, stack)))

    def record_resource(
        self,
        stack: StackRef,
        revision: int,
        resource: Resource,
        *,
        run: RunRef | None = None,
    ) -> None:
        """Record one applied resource's state in the release (fenced on ``run``)."""
        self.record_resources(stack, revision, [resource], run=run)

    def record_resources(
        self,
        stack: StackRef,
        revision: int,
        resources: Iterable[Resource],
        *,
        run: RunRef | None = None,
    ) -> None:
        """Record applied resources' state in the release, in one transaction (fenced on
        ``run``): an upsert each, new ones appended in the order given."""
        t = release_resources.c
        bodies = [(r.id, self.sealer.seal(stack, revision, r)) for r in resources]
        if not bodies:
            return
        with self._tx(write=True) as conn:
            self._fence(conn, stack, revision, run, share=True)
            known = {
                row.resource_id
                for row in conn.execute(
                    sa.select(t.resource_id)
                    .where(*self._where_state(stack, revision))
                    .where(t.resource_id.in_([rid for rid, _ in bodies]))
                )
            }
            # executemany of one statement each: compiled once, whatever the group's size
            again = [{"rid": rid, "sealed": body} for rid, body in bodies if rid in known]
            if again:
                conn.execute(
                    release_resources.update()
                    .where(*self._where_state(stack, revision))
                    .where(t.resource_id == sa.bindparam("rid"))
                    .values(body=sa.bindparam("sealed")),
                    again,
                )
            fresh = [(rid, body) for rid, body in bodies if rid not in known]
            if not fresh:
                return
            position = conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(t.position), 0)).where(
                    *self._where_state(stack, revision)
                )
            ).scalar_one()
            insert = self._insert(release_resources)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["project", "workspace", "revision", "resource_id"],
                    set_={"body": insert.excluded.body},
                ),
                [
                    {
                        "project": stack.project,
                        "workspace": stack.workspace,
                        "revision": revision,
                        "resource_id": rid,
                        "position": position + n,
                        "body": body,
                    }
                    for n, (rid, body) in enumerate(fresh, start=1)
                ],
            )

    def record_deletion(
        self,
        stack: StackRef,
        revision: int,
        resource_id: str,
        *,
        run: RunRef | None = None,
    ) -> None:
        """Remove one deleted resource from the release's state (fenced; idempotent)."""
        self.record_deletions(stack, revision, [resource_id], run=run)

    def record_deletions(
        self,
        stack: StackRef,
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
            self._fence(conn, stack, revision, run, share=True)
            conn.execute(
                release_resources.delete()
                .where(*self._where_state(stack, revision))
                .where(release_resources.c.resource_id.in_(ids))
            )

    def recover(self, holder: StackLock, reason: str) -> bool:
        """Close the release ``holder`` stands for as failed with ``reason`` and free the
        stack, if that lock is still the one held (compare-and-set). True if it was."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, holder.stack, share=False)
            if row is None or self._lock_model(row) != holder:
                return False
            self._fail_release(conn, holder.stack, holder.revision, reason)
            self._release_lock(conn, holder.stack)
            return True

    def _fail_release(self, conn: Connection, stack: StackRef, revision: int, reason: str) -> None:
        conn.execute(
            releases.update()
            .where(*self._where_release(stack, revision))
            .where(releases.c.phase.not_in([Phase.succeeded.value, Phase.failed.value]))
            .values(phase=Phase.failed.value, error=reason, modified_at=now())
        )

    def transfer(self, holder: StackLock, run: RunRef) -> bool:
        """Hand the stack from ``holder`` (a run that has closed) to ``run`` of the same
        workflow (a reset's new run); compare-and-set, True if it happened."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, holder.stack, share=False)
            if row is None or self._lock_model(row) != holder:
                return False
            conn.execute(
                stack_locks.update()
                .where(*self._where_stack(stack_locks, holder.stack))
                .values(workflow_id=run.workflow_id, run_id=run.run_id)
            )
            conn.execute(
                releases.update()
                .where(*self._where_release(holder.stack, holder.revision))
                .values(workflow_id=run.workflow_id, run_id=run.run_id, modified_at=now())
            )
            return True

    def unlock(self, stack: StackRef, reason: str | None = None) -> Release:
        """Free the stack by hand: its release in progress becomes failed; return the latest."""
        with self._tx(write=True) as conn:
            row = self._lock_row(conn, stack, share=False)
            if row is not None:
                lock = self._lock_model(row)
                self._fail_release(
                    conn,
                    stack,
                    lock.revision,
                    reason
                    or f"unlocked by hand while {lock.operation} was in progress; the "
                    "operation may not have finished",
                )
                self._release_lock(conn, stack)
        with self._tx() as conn:
            row = conn.execute(
                sa.select(releases)
                .where(*self._where_stack(releases, stack))
                .order_by(releases.c.revision.desc())
                .limit(1)
            ).first()
            if row is None:
                raise NotFoundError(f"stack {stack} has no releases")
            return self._release(conn, row, with_spec=False, with_state=True)

    def import_release(self, release: Release) -> Release:
        """Store a release as it is (revision, phase, times, state); ConflictError if taken.
        An imported release still in progress locks its stack with no run (unlock by hand).
        Its spec is the one it carries: a ``spec_ref`` from input is never taken (it would
        show a spec stored for another stack under this one)."""
        spec_ref = self.put_spec(release.spec) if release.spec is not None else None
        with self._tx(write=True) as conn:
            exists = conn.execute(
                sa.select(releases.c.revision).where(
                    *self._where_release(release.stack_ref, release.revision)
                )
            ).first()
            if exists is not None:
                raise ConflictError(
                    f"release {release.stack_ref}/{release.revision} exists already"
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
                    source=release.source.model_dump(mode="json") if release.source else None,
                    policy=release.policy.model_dump(mode="json") if release.policy else None,
                    set_run=release.set_run,
                )
            )
            rows = [
                {
                    "project": release.project,
                    "workspace": release.workspace,
                    "revision": release.revision,
                    "resource_id": r.id,
                    "position": i,
                    "body": self.sealer.seal(release.stack_ref, release.revision, r),
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
