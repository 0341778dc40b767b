"""The API's ``Idempotency-Key`` claims (:class:`~stackflow.state.protocols.RunKeys`).

A start with a key claims it first, for its stack and request, then records the run it
made: a retried request finds that run with one primary-key read, where it used to list the
stack's runs of the last day from Temporal's visibility and decode their memos (about 40 ms
of every start). Claims older than the window no longer count and are dropped as the
stack's next claim is made."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from stackflow.core.refs import StackRef
from stackflow.state.models import RunKey, as_utc, now
from stackflow.state.policy_store import PolicyBindingStore
from stackflow.state.schema import run_keys


class RunKeyStore(PolicyBindingStore):
    def claim_run_key(
        self, stack: StackRef, key: str, digest: str, *, window: timedelta
    ) -> RunKey | None:
        """Claim ``key`` for a start of ``stack`` with the request ``digest``: None when this
        call made the claim, else the claim made in the last ``window``."""
        k = run_keys.c
        kept = self.sealer.keyed(digest, "run-key")  # the request may hold secrets
        stamp = now()
        where = self._where_stack(run_keys, stack)
        with self._tx(write=True) as conn:
            conn.execute(run_keys.delete().where(*where, k.created_at < stamp - window))
            made = conn.execute(
                self._insert(run_keys)
                .values(
                    project=stack.project,
                    workspace=stack.workspace,
                    key=key,
                    digest=kept,
                    created_at=stamp,
                )
                .on_conflict_do_nothing(index_elements=["project", "workspace", "key"])
                .returning(k.key)
            ).first()
            if made is not None:
                return None
            row = conn.execute(sa.select(run_keys).where(*where, k.key == key)).one()
        return RunKey(
            same_request=row.digest == kept,
            workflow_id=row.workflow_id,
            run_id=row.run_id,
            created_at=as_utc(row.created_at),
        )

    def record_run_key(self, stack: StackRef, key: str, workflow_id: str, run_id: str) -> None:
        """The run the start claimed by ``key`` made."""
        k = run_keys.c
        with self._tx(write=True) as conn:
            conn.execute(
                run_keys.update()
                .where(*self._where_stack(run_keys, stack), k.key == key)
                .values(workflow_id=workflow_id, run_id=run_id)
            )

    def drop_run_key(self, stack: StackRef, key: str) -> None:
        """Give up a claim whose start was refused (it made no run): the key is free again."""
        k = run_keys.c
        with self._tx(write=True) as conn:
            conn.execute(
                run_keys.delete().where(
                    *self._where_stack(run_keys, stack), k.key == key, k.run_id.is_(None)
                )
            )
