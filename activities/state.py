"""A per-process, incremental view of the state of releases that are being applied.

``ReleaseStore.get`` parses the release record (which holds the whole spec and the prior
state) and folds the whole journal on every call. Called once per resource activity that is
O(N) per node and O(N²) per run: 1,000 files took over two minutes. This reader parses the
record once per revision and then only reads the journal lines appended since its last look,
so each activity costs O(new entries).

Only in-progress releases are read through it: a final release folds its journal into the
record and deletes the journal, which the reader notices (journal gone or replaced) and
answers by loading the record again.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stackflow.release import RELEASE_TYPE, ReleaseStore
from stackflow.spec import Resource
from stackflow.store.filesystem import FileRecordStore

_VIEWS = 16


@dataclass
class _View:
    table: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Resource JSON by id, in state order (dicts keep insertion order)."""
    offset: int = 0
    """Bytes of the journal file consumed (file store) or entries consumed (other stores)."""
    inode: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class ReleaseStateReader:
    def __init__(self, releases: ReleaseStore) -> None:
        self.releases = releases
        self._views: OrderedDict[tuple[str, str, int], _View] = OrderedDict()
        self._lock = threading.Lock()

    # ---- public ---------------------------------------------------------------------------

    def resource(
        self, project: str, workspace: str, revision: int, resource_id: str
    ) -> Resource | None:
        """The latest state of one resource in the release (None if it has none)."""
        raw = self._fresh(project, workspace, revision).get(resource_id)  # atomic under the GIL
        return None if raw is None else Resource.model_validate(raw)

    def resources(
        self, project: str, workspace: str, revision: int, ids: Iterable[str] | None = None
    ) -> dict[str, Resource]:
        """State of the given ids (all when None) that the release has, by id."""
        table = self._fresh(project, workspace, revision)
        if ids is None:
            with self._view_lock(project, workspace, revision):
                table = dict(table)
            ids = list(table)
        found = {rid: table.get(rid) for rid in ids}
        return {rid: Resource.model_validate(raw) for rid, raw in found.items() if raw is not None}

    # ---- internals ------------------------------------------------------------------------

    def _fresh(self, project: str, workspace: str, revision: int) -> dict[str, dict[str, Any]]:
        key = (project, workspace, revision)
        with self._lock:
            view = self._views.get(key)
            if view is None:
                view = self._views[key] = _View()
                view.offset = -1  # not loaded yet
            self._views.move_to_end(key)
            while len(self._views) > _VIEWS:
                self._views.popitem(last=False)
        with view.lock:
            if view.offset < 0 or not self._catch_up(view, project, workspace, revision):
                self._reload(view, project, workspace, revision)
            return view.table

    def _view_lock(self, project: str, workspace: str, revision: int) -> threading.Lock:
        with self._lock:
            view = self._views.get((project, workspace, revision))
        return view.lock if view is not None else threading.Lock()

    def _reload(self, view: _View, project: str, workspace: str, revision: int) -> None:
        ns = ReleaseStore.namespace(project, workspace)
        record = self.releases.store.get(RELEASE_TYPE, ns, str(revision))
        resources = (record.spec.get("state") or {}).get("resources") or []
        view.table = {raw["id"]: raw for raw in resources}  # a new dict: old readers keep theirs
        view.offset = 0
        view.inode = None
        if not self._catch_up(view, project, workspace, revision):
            raise RuntimeError(f"journal of release {revision} of {ns} changed while loading")

    def _catch_up(self, view: _View, project: str, workspace: str, revision: int) -> bool:
        """Fold journal entries not seen yet; False when the view must be reloaded."""
        ns = ReleaseStore.namespace(project, workspace)
        store = self.releases.store
        if not isinstance(store, FileRecordStore):
            entries = store.read_journal(RELEASE_TYPE, ns, str(revision))
            if len(entries) < view.offset:
                return False
            self._fold(view, entries[view.offset :])
            view.offset = len(entries)
            return True
        path = store.journal_path(RELEASE_TYPE, ns, str(revision))
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return view.offset == 0  # no journal yet; one that went away was folded
        with handle:
            st = os.fstat(handle.fileno())
            if (view.inode is not None and st.st_ino != view.inode) or st.st_size < view.offset:
                return False
            handle.seek(view.offset)
            data = handle.read()
        view.inode = st.st_ino
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        entries = []
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn line (a crashed writer): that entry never happened
            if isinstance(entry, dict):
                entries.append(entry)
        self._fold(view, entries)
        view.offset += end
        return True

    @staticmethod
    def _fold(view: _View, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            if entry.get("op") == "upsert":
                raw = entry["resource"]
                view.table[raw["id"]] = raw
            elif entry.get("op") == "delete":
                view.table.pop(str(entry.get("id")), None)
