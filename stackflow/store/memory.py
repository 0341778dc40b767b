"""An in-memory record store, for unit tests of higher layers (same rules, same suite)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from stackflow.store.base import Record, RecordStore, check_names, id_sort_key

_Key = tuple[str, str, str]


class MemoryRecordStore(RecordStore):
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._records: dict[_Key, Record] = {}
        self._journals: dict[_Key, list[dict[str, Any]]] = {}

    @contextmanager
    def _exclusive(self, type_: str, namespace: str) -> Iterator[None]:
        with self._lock:
            yield

    def _load(self, type_: str, namespace: str, rid: str) -> Record | None:
        with self._lock:
            record = self._records.get((type_, namespace, rid))
            return None if record is None else record.model_copy(deep=True)

    def _save(self, record: Record) -> None:
        m = record.metadata
        with self._lock:
            self._records[(m.type, m.namespace, m.id)] = record.model_copy(deep=True)

    def _remove(self, type_: str, namespace: str, rid: str) -> None:
        with self._lock:
            self._records.pop((type_, namespace, rid), None)
            self._journals.pop((type_, namespace, rid), None)

    def ids(self, type_: str, namespace: str) -> list[str]:
        check_names(type_, namespace)
        with self._lock:
            found = [k[2] for k in self._records if k[0] == type_ and k[1] == namespace]
        return sorted(found, key=id_sort_key)

    def append_journal(
        self, type_: str, namespace: str, rid: str, entry: Mapping[str, Any]
    ) -> None:
        check_names(type_, namespace, rid)
        with self._lock:
            entries = self._journals.setdefault((type_, namespace, rid), [])
            entries.append(copy.deepcopy(dict(entry)))

    def read_journal(self, type_: str, namespace: str, rid: str) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._journals.get((type_, namespace, rid), []))

    def clear_journal(self, type_: str, namespace: str, rid: str) -> None:
        with self._lock:
            self._journals.pop((type_, namespace, rid), None)
