"""Which stack owns each OnPrem path (:class:`~stackflow.state.protocols.PathClaims`).

A path (its real path on the worker's host) is claimed by a stack before the OnPrem runtime
first writes it, and released once the runtime deleted it. Another stack's claim refuses
the write (``OwnedElsewhere``), as an object annotated by another stack is in Kubernetes.

Two stacks applying one path at once cannot both win: a claim is an insert on the path's
primary key (PostgreSQL makes the second inserter wait for the first to commit, then finds
its row; SQLite serialises write transactions), made before the file is written, so the
loser writes nothing. A claim whose owner neither holds its stack's lock (a run in flight)
nor records the resource in its latest release (it was removed by a refresh, or its apply
failed before it was recorded) is stale: the next stack's claim takes it over with a
compare-and-set on the old owner, so two takeovers cannot both succeed either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stackflow.core.refs import RunRef, StackRef
from stackflow.state.models import now
from stackflow.state.run_keys import RunKeyStore
from stackflow.state.schema import onprem_paths, release_resources, releases, stack_locks

CLAIM_CHUNK = 500
"""Paths looked up in one statement."""


@dataclass(frozen=True)
class PathOwner:
    """The stack that owns a path, and the resource of it that does."""

    stack: StackRef
    resource_id: str


class PathClaimStore(RunKeyStore):
    def path_owners(self, stack: StackRef, paths: Iterable[str]) -> dict[str, PathOwner]:
        """Of ``paths``, those another stack owns (its claim still live), with the owner."""
        wanted = list(dict.fromkeys(paths))
        found: dict[str, PathOwner] = {}
        with self._tx() as conn:
            for start in range(0, len(wanted), CLAIM_CHUNK):
                for row in self._foreign(conn, stack, wanted[start : start + CLAIM_CHUNK]):
                    owner = PathOwner(StackRef(row.project, row.workspace), row.resource_id)
                    if self._live(conn, owner):
                        found[row.path] = owner
        return found

    def claim_paths(
        self,
        stack: StackRef,
        claims: Mapping[str, str],
        *,
        revision: int | None,
        run: RunRef | None,
    ) -> dict[str, PathOwner]:
        """Claim each path of ``claims`` (path -> resource id) for ``stack``, fenced on
        ``run`` when ``revision`` is given; the paths another stack owns are left alone and
        returned with their owner (all the others are this stack's once this returns)."""
        refused: dict[str, PathOwner] = {}
        p = onprem_paths.c
        mine = {"project": stack.project, "workspace": stack.workspace}
        ordered = sorted(claims)  # one order for every claimer: concurrent inserts never deadlock
        with self._tx(write=True) as conn:
            if revision is not None:
                self._fence(conn, stack, revision, run, share=True)
            for start in range(0, len(ordered), CLAIM_CHUNK):
                chunk = ordered[start : start + CLAIM_CHUNK]
                stamp = now()
                conn.execute(
                    self._insert(onprem_paths)
                    .values(
                        [
                            {"path": path, "resource_id": claims[path], "claimed_at": stamp, **mine}
                            for path in chunk
                        ]
                    )
                    .on_conflict_do_nothing(index_elements=["path"])
                )
                rows = conn.execute(sa.select(onprem_paths).where(p.path.in_(chunk))).all()
                for row in rows:
                    path, resource_id = row.path, claims[row.path]
                    if (row.project, row.workspace) == (stack.project, stack.workspace):
                        if row.resource_id != resource_id:
                            conn.execute(
                                onprem_paths.update()
                                .where(p.path == path, *self._where_stack(onprem_paths, stack))
                                .values(resource_id=resource_id)
                            )
                        continue
                    owner = PathOwner(StackRef(row.project, row.workspace), row.resource_id)
                    if self._live(conn, owner):
                        refused[path] = owner
                        continue
                    taken = conn.execute(  # stale: taken over unless someone else just did
                        onprem_paths.update()
                        .where(
                            p.path == path,
                            p.project == row.project,
                            p.workspace == row.workspace,
                            p.resource_id == row.resource_id,
                        )
                        .values(resource_id=resource_id, claimed_at=stamp, **mine)
                        .returning(p.path)
                    ).first()
                    if taken is None:
                        now_row = conn.execute(sa.select(onprem_paths).where(p.path == path)).one()
                        refused[path] = PathOwner(
                            StackRef(now_row.project, now_row.workspace), now_row.resource_id
                        )
        return refused

    def release_paths(
        self,
        stack: StackRef,
        paths: Iterable[str],
        *,
        revision: int | None,
        run: RunRef | None,
    ) -> None:
        """Give up ``stack``'s claims on ``paths`` (deleted): another stack may claim them."""
        p = onprem_paths.c
        gone = list(dict.fromkeys(paths))
        with self._tx(write=True) as conn:
            if revision is not None:
                self._fence(conn, stack, revision, run, share=True)
            for start in range(0, len(gone), CLAIM_CHUNK):
                conn.execute(
                    onprem_paths.delete().where(
                        p.path.in_(gone[start : start + CLAIM_CHUNK]),
                        *self._where_stack(onprem_paths, stack),
                    )
                )

    def _foreign(self, conn: Connection, stack: StackRef, paths: list[str]) -> list[Any]:
        p = onprem_paths.c
        return list(
            conn.execute(
                sa.select(onprem_paths).where(
                    p.path.in_(paths),
                    sa.or_(p.project != stack.project, p.workspace != stack.workspace),
                )
            )
        )

    def _live(self, conn: Connection, owner: PathOwner) -> bool:
        """Whether ``owner``'s claim still counts: its stack is held by a run, or its latest
        release records the resource."""
        held = conn.execute(
            sa.select(stack_locks.c.project).where(*self._where_stack(stack_locks, owner.stack))
        ).first()
        if held is not None:
            return True
        latest = (
            sa.select(sa.func.max(releases.c.revision))
            .where(*self._where_stack(releases, owner.stack))
            .scalar_subquery()
        )
        t = release_resources.c
        recorded = conn.execute(
            sa.select(t.resource_id).where(
                *self._where_stack(release_resources, owner.stack),
                t.revision == latest,
                t.resource_id == owner.resource_id,
            )
        ).first()
        return recorded is not None
