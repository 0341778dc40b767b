"""Stacks bound to git sources (:class:`~stackflow.state.protocols.SourceBindings`): one
binding per stack, its webhook secret sealed at rest like every secret the backend keeps."""

from __future__ import annotations

import builtins

import sqlalchemy as sa

from stackflow.core.refs import StackRef
from stackflow.model.source import BoundSource, GitSource, same_repository
from stackflow.state.models import SourcePush, as_utc, now
from stackflow.state.run_events import RunEvents
from stackflow.state.schema import source_pushes, stack_sources


class SourceBindingStore(RunEvents):
    def bind_source(self, stack: StackRef, source: GitSource, *, by: str | None = None) -> None:
        """Bind ``stack`` to ``source`` (replacing any binding it had)."""
        values = {
            "url": source.url,
            "ref": source.ref,
            "path": source.path,
            "mode": source.on_push.value,  # the column keeps the field's former name
            "auto_approve": source.auto_approve,
            "secret": self.sealer.seal_text(
                source.secret, stack.project, stack.workspace, "source", "secret"
            ),
            "updated_by": by,
            "updated_at": now(),
        }
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(stack_sources)
                .values(project=stack.project, workspace=stack.workspace, **values)
                .on_conflict_do_update(index_elements=["project", "workspace"], set_=values)
            )

    def unbind_source(self, stack: StackRef) -> bool:
        """Remove the stack's binding; whether it had one."""
        with self._tx(write=True) as conn:
            gone = conn.execute(
                stack_sources.delete()
                .where(*self._where_stack(stack_sources, stack))
                .returning(stack_sources.c.project)
            ).first()
        return gone is not None

    def source_of(self, stack: StackRef) -> BoundSource | None:
        with self._tx() as conn:
            row = conn.execute(
                sa.select(stack_sources).where(*self._where_stack(stack_sources, stack))
            ).first()
        return None if row is None else self._binding(row)

    def sources_of_repository(self, url: str) -> builtins.list[tuple[StackRef, BoundSource]]:
        """Every stack bound to the repository ``url`` names (``.git``, a trailing slash and
        the host's case aside), in stack order."""
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(stack_sources).order_by(
                    stack_sources.c.project, stack_sources.c.workspace
                )
            ).all()
        return [
            (StackRef(row.project, row.workspace), self._binding(row))
            for row in rows
            if same_repository(row.url, url)
        ]

    def last_push(self, stack: StackRef) -> SourcePush | None:
        """The commit of the last run a webhook delivery started for ``stack``."""
        with self._tx() as conn:
            row = conn.execute(
                sa.select(source_pushes).where(*self._where_stack(source_pushes, stack))
            ).first()
        if row is None:
            return None
        return SourcePush(url=row.url, commit=row.commit, at=as_utc(row.pushed_at))

    def record_push(self, stack: StackRef, url: str, commit: str) -> None:
        """A webhook delivery started a run of ``commit`` of ``url`` for ``stack``."""
        values = {"url": url, "commit": commit, "pushed_at": now()}
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(source_pushes)
                .values(project=stack.project, workspace=stack.workspace, **values)
                .on_conflict_do_update(index_elements=["project", "workspace"], set_=values)
            )

    def _binding(self, row: sa.Row[object]) -> BoundSource:
        r = row._mapping
        secret = self.sealer.open_text(
            r["secret"], r["project"], r["workspace"], "source", "secret"
        )
        return BoundSource(
            url=r["url"],
            ref=r["ref"],
            path=r["path"],
            on_push=r["mode"],
            auto_approve=r["auto_approve"],
            secret=secret,
            bound_by=r["updated_by"],
        )
