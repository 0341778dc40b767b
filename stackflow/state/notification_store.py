"""A project's notification destinations and the deliveries that failed for good
(:class:`~stackflow.state.protocols.NotificationStore`)."""

from __future__ import annotations

import builtins
from contextlib import AbstractContextManager

import sqlalchemy as sa

from stackflow.core.errors import ConflictError
from stackflow.model.notifications import TARGET_LIMIT, NotificationFailure, NotificationTarget
from stackflow.state.models import as_utc
from stackflow.state.schema import notification_failures, notification_targets
from stackflow.state.source_bindings import SourceBindingStore


class NotificationRecords(SourceBindingStore):
    def set_notification_targets(
        self, project: str, targets: builtins.list[NotificationTarget]
    ) -> None:
        """Replace the project's destinations with ``targets`` (in that order)."""
        rows = [
            {
                "project": project,
                "name": t.name,
                "url": t.url,
                "secret": self.sealer.seal_text(t.secret, project, t.name, "notify"),
                "types": list(t.types),
                "position": i,
            }
            for i, t in enumerate(targets)
        ]
        with self._tx(write=True) as conn, self._targets_lock(conn, project):
            conn.execute(
                notification_targets.delete().where(notification_targets.c.project == project)
            )
            if rows:
                conn.execute(notification_targets.insert(), rows)

    def put_notification_target(self, project: str, target: NotificationTarget) -> bool:
        """Add ``target`` after the project's destinations, or replace the one of its name
        in its place; whether it was added. ConflictError when the project has
        ``TARGET_LIMIT`` destinations already."""
        t = notification_targets.c
        values = {
            "url": target.url,
            "secret": self.sealer.seal_text(target.secret, project, target.name, "notify"),
            "types": list(target.types),
        }
        where = (t.project == project, t.name == target.name)
        with self._tx(write=True) as conn, self._targets_lock(conn, project):
            if conn.execute(notification_targets.update().where(*where).values(**values)).rowcount:
                return False
            count, last = conn.execute(
                sa.select(sa.func.count(), sa.func.max(t.position)).where(t.project == project)
            ).one()
            if count >= TARGET_LIMIT:
                raise ConflictError(
                    f"project {project} has {TARGET_LIMIT} notification destinations, the most "
                    "it may have: remove one first"
                )
            position = 0 if last is None else last + 1
            conn.execute(
                notification_targets.insert().values(
                    project=project, name=target.name, position=position, **values
                )
            )
        return True

    def remove_notification_target(self, project: str, name: str) -> bool:
        """Remove the project's destination ``name``; whether it had one."""
        t = notification_targets.c
        with self._tx(write=True) as conn, self._targets_lock(conn, project):
            gone = conn.execute(
                notification_targets.delete()
                .where(t.project == project, t.name == name)
                .returning(t.name)
            ).first()
        return gone is not None

    def _targets_lock(self, conn: sa.Connection, project: str) -> AbstractContextManager[None]:
        """The project's destinations written one writer at a time (PostgreSQL: an advisory
        lock until commit; SQLite's write transactions are serialised already)."""
        return self._run_lock(conn, f"notification-targets/{project}")

    def notification_targets(self, project: str) -> builtins.list[NotificationTarget]:
        t = notification_targets.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(notification_targets).where(t.project == project).order_by(t.position)
            ).all()
        return [
            NotificationTarget(
                name=r.name,
                url=r.url,
                secret=self.sealer.open_text(r.secret, project, r.name, "notify"),
                types=list(r.types),
            )
            for r in rows
        ]

    def record_notification_failure(self, failure: NotificationFailure) -> None:
        """Keep a delivery that failed for good (once per project, target and event)."""
        values = failure.model_dump(exclude={"project", "target", "event_id"})
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(notification_failures)
                .values(
                    project=failure.project,
                    target=failure.target,
                    event_id=failure.event_id,
                    **values,
                )
                .on_conflict_do_update(
                    index_elements=["project", "target", "event_id"], set_=values
                )
            )

    def notification_failures(
        self, project: str, limit: int = 100
    ) -> builtins.list[NotificationFailure]:
        """The project's failed deliveries, newest first."""
        t = notification_failures.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(notification_failures)
                .where(t.project == project)
                .order_by(t.failed_at.desc(), t.target, t.event_id)
                .limit(limit)
            ).all()
        return [
            NotificationFailure(
                project=r.project,
                target=r.target,
                type=r.type,
                event_id=r.event_id,
                run_id=r.run_id,
                attempts=r.attempts,
                error=r.error,
                failed_at=as_utc(r.failed_at),
            )
            for r in rows
        ]


__all__ = ["NotificationRecords"]
