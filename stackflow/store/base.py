"""Records and the store interface. The rules (conflicts, owners, phases, finalizers) live
here once; a backend only provides an exclusive section and raw load/save/remove."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from stackflow.errors import (
    ConflictError,
    InvalidNameError,
    NotFoundError,
    OwnerConflictError,
    PhaseConflictError,
)

_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


class RecordPhase(StrEnum):
    running = "running"
    tearingDown = "tearingDown"


class Metadata(BaseModel):
    namespace: str
    type: str
    id: str
    version: int = 0
    owner: str = ""
    phase: RecordPhase = RecordPhase.running
    finalizers: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    created: datetime | None = None
    updated: datetime | None = None


class Record(BaseModel):
    """Metadata plus an opaque JSON-able spec."""

    metadata: Metadata
    spec: dict[str, Any] = Field(default_factory=dict)


def now() -> datetime:
    return datetime.now(UTC)


def id_sort_key(rid: str) -> tuple[int, int, str]:
    """Numeric ids sort numerically, before the others."""
    return (0, int(rid), "") if rid.isdigit() else (1, 0, rid)


def check_names(type_: str, namespace: str, rid: str | None = None) -> None:
    """Refuse names that could escape the store's directory or be ambiguous."""
    if not _TYPE.match(type_):
        raise InvalidNameError(f"invalid record type {type_!r}")
    parts = namespace.split("/")
    if not namespace or any(not _NAME.match(p) or p in (".", "..") for p in parts):
        raise InvalidNameError(
            f"invalid namespace {namespace!r}: use letters, digits, '.', '_', '-' and '/'"
        )
    if rid is not None and (not _NAME.match(rid) or rid in (".", "..")):
        raise InvalidNameError(f"invalid record id {rid!r}: use letters, digits, '.', '_', '-'")


def _where(type_: str, namespace: str, rid: str) -> str:
    return f"{type_} {namespace}/{rid}"


class RecordStore(ABC):
    """A store of records. Every method is synchronous and safe to call from many threads."""

    # ---- backend primitives -------------------------------------------------------------

    @abstractmethod
    def _exclusive(self, type_: str, namespace: str) -> AbstractContextManager[None]:
        """A section no other writer of this namespace (any thread or process) runs in."""

    @abstractmethod
    def _load(self, type_: str, namespace: str, rid: str) -> Record | None: ...

    @abstractmethod
    def _save(self, record: Record) -> None:
        """Write the record atomically (all or nothing, durable on return)."""

    @abstractmethod
    def _remove(self, type_: str, namespace: str, rid: str) -> None:
        """Delete the record and its journal."""

    @abstractmethod
    def ids(self, type_: str, namespace: str) -> list[str]:
        """Ids of the records of a namespace, sorted (numeric ids numerically)."""

    @abstractmethod
    def append_journal(
        self, type_: str, namespace: str, rid: str, entry: Mapping[str, Any]
    ) -> None:
        """Durably append one entry to the record's journal (an append-only log)."""

    @abstractmethod
    def read_journal(self, type_: str, namespace: str, rid: str) -> list[dict[str, Any]]:
        """The journal's entries in order; a torn last entry is skipped."""

    @abstractmethod
    def clear_journal(self, type_: str, namespace: str, rid: str) -> None: ...

    # ---- reads ----------------------------------------------------------------------------

    def get(self, type_: str, namespace: str, rid: str) -> Record:
        check_names(type_, namespace, rid)
        record = self._load(type_, namespace, rid)
        if record is None:
            raise NotFoundError(f"{_where(type_, namespace, rid)} not found")
        return record

    def get_metadata(self, type_: str, namespace: str, rid: str) -> Metadata:
        """Only the metadata; backends may make this cheaper than :meth:`get`."""
        return self.get(type_, namespace, rid).metadata

    def list(
        self, type_: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Record]:
        check_names(type_, namespace)
        out = []
        for rid in self.ids(type_, namespace):
            record = self._load(type_, namespace, rid)
            if record is None:  # destroyed meanwhile
                continue
            if labels and any(record.metadata.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(record)
        return out

    # ---- writes ---------------------------------------------------------------------------

    def create(self, record: Record) -> Record:
        """Store a new record at version 1; ConflictError if it exists."""
        meta = record.metadata
        check_names(meta.type, meta.namespace, meta.id)
        with self._exclusive(meta.type, meta.namespace):
            if self._load(meta.type, meta.namespace, meta.id) is not None:
                raise ConflictError(f"{_where(meta.type, meta.namespace, meta.id)} exists already")
            stamp = now()
            new = record.model_copy(
                deep=True,
                update={
                    "metadata": meta.model_copy(
                        update={
                            "version": 1,
                            "phase": RecordPhase.running,
                            "created": stamp,
                            "updated": stamp,
                        }
                    )
                },
            )
            self._save(new)
            return new

    def update(self, record: Record) -> Record:
        """Compare-and-swap on ``record.metadata.version``; returns the record at version+1.

        Owner is checked before the version; labels and spec are taken from ``record``.
        """
        meta = record.metadata
        with self._locked_current(meta.type, meta.namespace, meta.id) as current:
            self._check_owner(current, meta.owner)
            if current.metadata.phase is RecordPhase.tearingDown:
                raise PhaseConflictError(
                    f"{_where(meta.type, meta.namespace, meta.id)} is tearing down"
                )
            if meta.version != current.metadata.version:
                raise ConflictError(
                    f"{_where(meta.type, meta.namespace, meta.id)}: version {meta.version} "
                    f"is not the current version {current.metadata.version}"
                )
            new = Record(
                metadata=current.metadata.model_copy(
                    update={
                        "version": current.metadata.version + 1,
                        "labels": dict(meta.labels),
                        "updated": now(),
                    }
                ),
                spec=record.spec,
            )
            self._save(new)
            return new.model_copy(deep=True)

    def teardown(self, type_: str, namespace: str, rid: str, owner: str) -> Record:
        """Mark the record as tearing down (no more updates; finalizers may still be removed)."""
        with self._locked_current(type_, namespace, rid) as current:
            self._check_owner(current, owner)
            if current.metadata.phase is RecordPhase.tearingDown:
                return current
            return self._bump(current, phase=RecordPhase.tearingDown)

    def destroy(self, type_: str, namespace: str, rid: str, owner: str) -> None:
        """Remove the record; refused while it has finalizers."""
        with self._locked_current(type_, namespace, rid) as current:
            self._check_owner(current, owner)
            if current.metadata.finalizers:
                raise ConflictError(
                    f"{_where(type_, namespace, rid)} has finalizers "
                    f"{', '.join(current.metadata.finalizers)}"
                )
            self._remove(type_, namespace, rid)

    def add_finalizer(self, type_: str, namespace: str, rid: str, finalizer: str) -> Record:
        with self._locked_current(type_, namespace, rid) as current:
            if current.metadata.phase is RecordPhase.tearingDown:
                raise PhaseConflictError(f"{_where(type_, namespace, rid)} is tearing down")
            if finalizer in current.metadata.finalizers:
                return current
            return self._bump(current, finalizers=[*current.metadata.finalizers, finalizer])

    def remove_finalizer(self, type_: str, namespace: str, rid: str, finalizer: str) -> Record:
        with self._locked_current(type_, namespace, rid) as current:
            if finalizer not in current.metadata.finalizers:
                return current
            kept = [f for f in current.metadata.finalizers if f != finalizer]
            return self._bump(current, finalizers=kept)

    # ---- helpers --------------------------------------------------------------------------

    def _bump(self, current: Record, **changes: Any) -> Record:
        new = Record(
            metadata=current.metadata.model_copy(
                update={**changes, "version": current.metadata.version + 1, "updated": now()}
            ),
            spec=current.spec,
        )
        self._save(new)
        return new.model_copy(deep=True)

    @staticmethod
    def _check_owner(current: Record, owner: str) -> None:
        if owner != current.metadata.owner:
            m = current.metadata
            raise OwnerConflictError(
                f"{_where(m.type, m.namespace, m.id)} is owned by {m.owner!r}, not {owner!r}"
            )

    @contextmanager
    def _locked_current(self, type_: str, namespace: str, rid: str) -> Iterator[Record]:
        """Inside the exclusive section, the current record (NotFoundError if missing)."""
        check_names(type_, namespace, rid)
        with self._exclusive(type_, namespace):
            current = self._load(type_, namespace, rid)
            if current is None:
                raise NotFoundError(f"{_where(type_, namespace, rid)} not found")
            yield current
