"""Listings that answer a preview's reads: one LIST per kind and namespace instead of a GET
per object.

A preview batch that reads at least :data:`LIST_AT_LEAST` objects of one kind in one
namespace reads them all from one paginated LIST. The listing is kept for the run's later
preview batches on this worker for :data:`SNAPSHOT_SECONDS` (a preview is one snapshot of
the stack, as it is shown to be approved); listings of :data:`SNAPSHOT_BYTES` of JSON at most
are held in all (older ones go first; one larger than that serves only the batch that made
it). A listing holds each object as its compact JSON text, decoded for each read: what it
holds is the bytes it counts (the decoded dicts of a listing of ConfigMaps took 5.7 times
their JSON: 30 MB for 10,000), and no two readers share one object. Secrets are never listed
(:data:`NEVER_LISTED`), nor a kind whose namespace holds far more objects than the run's
preview reads there, all batches together (:data:`LIST_SPARE`).
A listing the server refuses (no ``list`` permission, say) leaves each object to its own GET.

An apply reads afresh. A delete in the run's walk may act on the listed object, but only on
the condition that it is still exactly that object (uid and resourceVersion preconditions);
otherwise it reads afresh too.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from stackflow.runtimes.base import RuntimeFailure
from stackflow.runtimes.kubernetes.client import JSON, ApiError, ApiResource, KubeClient

NEVER_LISTED = frozenset({("v1", "Secret")})
"""Kinds read one object at a time: a listing would hold every Secret of the namespace,
other applications' included, in the worker's memory."""
LIST_AT_LEAST = 8
"""Objects of one kind and namespace in a preview batch from which one LIST answers them."""
LIST_PAGE = 500
LIST_SPARE = 10
"""A listing is given up (each object read alone) once the kind holds more than this many
times the objects the run's preview reads there, and more than a page: a stack's few objects in a
namespace shared with thousands of others are not worth the listing."""
SNAPSHOT_SECONDS = 120.0
SNAPSHOT_BYTES = 64 * 1024 * 1024


class Listing:
    """Objects by name, each kept as its compact JSON text; ``size``: their characters."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self.size = 0

    def add(self, name: str, obj: JSON) -> None:
        text = json.dumps(obj, separators=(",", ":"))
        self.size += len(text) - len(self._texts.get(name, ""))
        self._texts[name] = text

    def get(self, name: str) -> JSON | None:
        """The object named ``name`` (a new one at each call), or None when not listed."""
        text = self._texts.get(name)
        if text is None:
            return None
        found: JSON = json.loads(text)
        return found

    def __len__(self) -> int:
        return len(self._texts)


def list_objects(
    client: KubeClient, api: ApiResource, namespace: str | None, wanted: int
) -> Listing | None:
    """Every object of the kind in the namespace (or cluster), by name, shaped as a GET
    returns it; None when the server refuses or fails, or when the kind holds far more
    objects than the ``wanted`` ones (each object is then read alone)."""
    path = api.path(namespace if api.namespaced else None)
    found = Listing()
    query = {"limit": str(LIST_PAGE)}
    most = max(LIST_PAGE, LIST_SPARE * wanted)
    try:
        while True:
            answer = client.request("GET", path, query=query)
            items = answer.get("items") or []
            remaining = (answer.get("metadata") or {}).get("remainingItemCount")
            if len(found) + len(items) + (remaining if isinstance(remaining, int) else 0) > most:
                return None
            for item in items:
                name = (item.get("metadata") or {}).get("name")
                if isinstance(name, str):
                    # list items carry no apiVersion and kind: as a GET answers them
                    found.add(name, {"apiVersion": api.api_version, "kind": api.kind, **item})
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return found
            query = {"limit": str(LIST_PAGE), "continue": str(token)}
    except (ApiError, RuntimeFailure):
        return None


class Snapshots:
    """Listings by (run, cluster, path), each loaded once (concurrent readers wait for it)."""

    def __init__(
        self,
        seconds: float = SNAPSHOT_SECONDS,
        size: int = SNAPSHOT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds = seconds
        self._size = size
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[float, Future[Listing | None]]] = (
            OrderedDict()
        )

    def get(self, key: tuple[Any, ...], load: Callable[[], Listing | None]) -> Listing | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._entries.get(key)
            mine = entry is None
            future: Future[Listing | None] = Future() if entry is None else entry[1]
            if mine:
                self._entries[key] = (now, future)
        if mine:
            try:
                future.set_result(load())
            except BaseException as exc:
                future.set_exception(exc)
                with self._lock:
                    self._entries.pop(key, None)
                raise
            with self._lock:
                self._trim()
        return future.result()

    def peek(self, key: tuple[Any, ...]) -> Listing | None:
        """The listing kept under ``key`` if one is loaded (never lists)."""
        with self._lock:
            self._expire(self._clock())
            entry = self._entries.get(key)
        if entry is None or not entry[1].done() or entry[1].exception() is not None:
            return None
        return entry[1].result()

    def _expire(self, now: float) -> None:
        for key, (at, _) in list(self._entries.items()):
            if now - at > self._seconds:
                del self._entries[key]

    def _trim(self) -> None:
        """The oldest loaded listings go first while more than ``size`` bytes are held."""

        def size(future: Future[Listing | None]) -> int:
            listing = future.result() if future.done() else None
            return listing.size if listing is not None else 0

        held = sum(size(f) for _, f in self._entries.values())
        for key, (_, future) in list(self._entries.items()):
            if held <= self._size:
                break
            if future.done():
                held -= size(future)
                del self._entries[key]
