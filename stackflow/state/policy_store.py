"""A project's policy bundle (:class:`~stackflow.state.protocols.PolicyBindings`): the
digest of a bundle kept as a blob, replaced by every push."""

from __future__ import annotations

import sqlalchemy as sa

from stackflow.model.policy import PolicyBinding
from stackflow.state.models import as_utc, check_ref, now
from stackflow.state.notification_store import NotificationRecords
from stackflow.state.schema import project_policies


class PolicyBindingStore(NotificationRecords):
    def bind_policy(self, project: str, digest: str, *, by: str | None = None) -> None:
        """Every later run of ``project`` evaluates the bundle ``digest`` (already stored)."""
        check_ref(digest, "policy bundle")
        values = {"digest": digest, "updated_by": by, "updated_at": now()}
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(project_policies)
                .values(project=project, **values)
                .on_conflict_do_update(index_elements=["project"], set_=values)
            )

    def unbind_policy(self, project: str) -> bool:
        with self._tx(write=True) as conn:
            gone = conn.execute(
                project_policies.delete()
                .where(project_policies.c.project == project)
                .returning(project_policies.c.project)
            ).first()
        return gone is not None

    def policy_of(self, project: str) -> PolicyBinding | None:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(project_policies).where(project_policies.c.project == project)
            ).first()
        if row is None:
            return None
        return PolicyBinding(
            project=row.project,
            digest=row.digest,
            updated_by=row.updated_by,
            updated_at=as_utc(row.updated_at),
        )
