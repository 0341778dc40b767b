"""Each run's event stream in the state backend
(:class:`~stackflow.state.protocols.RunEventLog`).

An append takes the run's write lock first (SQLite: the database's, ``BEGIN IMMEDIATE``;
PostgreSQL: a transaction-scoped advisory lock on the run id), drops the events whose key the
run already has, and numbers the rest after the run's last ``seq``. Appends of one run are
therefore committed in ``seq`` order: a reader that saw ``seq`` N has seen every event before
it, and a reader resuming after N never misses one committed later with a smaller number.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import PAGE_LIMIT, EventType, NewEvent, RunEvent
from stackflow.state.models import CHUNK, as_utc, now
from stackflow.state.records import Records
from stackflow.state.schema import run_events


class RunEvents(Records):
    @contextmanager
    def _run_lock(self, conn: Connection, run_id: str) -> Iterator[None]:
        """Serialise appends of one run (SQLite: the write transaction already does)."""
        yield

    def append_events(
        self, stack: StackRef, run: RunRef, events: Sequence[NewEvent]
    ) -> builtins.list[RunEvent]:
        """Append ``events`` to ``run``'s stream, numbered in order after its last one; an
        event whose key the run already has is left out (idempotent). Returns those
        appended."""
        if not events:
            return []
        fresh: dict[str, NewEvent] = {}
        for event in events:
            fresh.setdefault(event.digest, event)
        t = run_events.c
        appended: builtins.list[RunEvent] = []
        with self._tx(write=True) as conn, self._run_lock(conn, run.run_id):
            digests = builtins.list(fresh)
            for begin in range(0, len(digests), CHUNK):
                chunk = digests[begin : begin + CHUNK]
                seen = conn.execute(
                    sa.select(t.key).where(t.run_id == run.run_id, t.key.in_(chunk))
                ).scalars()
                for key in seen:
                    fresh.pop(key, None)
            if not fresh:
                return []
            last = conn.execute(
                sa.select(sa.func.max(t.seq)).where(t.run_id == run.run_id)
            ).scalar()
            seq, stamp, rows = int(last or 0), now(), []
            for digest, event in fresh.items():
                seq += 1
                at = event.at or stamp
                rows.append(
                    {
                        "run_id": run.run_id,
                        "seq": seq,
                        "project": stack.project,
                        "workspace": stack.workspace,
                        "workflow_id": run.workflow_id,
                        "key": digest,
                        "type": event.type.value,
                        "at": at,
                        "body": event.data,
                    }
                )
                # built from validated parts (a NewEvent, the clock): not validated again
                appended.append(
                    RunEvent.model_construct(seq=seq, type=event.type, time=at, data=event.data)
                )
            conn.execute(run_events.insert(), rows)
        return appended

    def events(
        self, stack: StackRef, run_id: str, *, after: int = 0, limit: int = PAGE_LIMIT
    ) -> builtins.list[RunEvent]:
        """The run's events after ``after``, in order, at most ``limit`` (only a run of
        ``stack``: another stack's run reads as no events)."""
        t = run_events.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.seq, t.type, t.at, t.body)
                .where(
                    t.run_id == run_id,
                    t.seq > after,
                    *self._where_stack(run_events, stack),
                )
                .order_by(t.seq)
                .limit(max(1, min(limit, PAGE_LIMIT)))
            ).all()
        return [
            RunEvent(seq=r.seq, type=EventType(r.type), time=as_utc(r.at), data=dict(r.body))
            for r in rows
        ]

    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None:
        """The run's newest event (None before its first)."""
        t = run_events.c
        with self._tx() as conn:
            row = conn.execute(
                sa.select(t.seq, t.type, t.at, t.body)
                .where(t.run_id == run_id, *self._where_stack(run_events, stack))
                .order_by(t.seq.desc())
                .limit(1)
            ).first()
        if row is None:
            return None
        return RunEvent(
            seq=row.seq, type=EventType(row.type), time=as_utc(row.at), data=dict(row.body)
        )
