"""A per-process cache of what a content-addressed ref names (a spec, a plan), or of a
verdict on it (a spec that passed the worker policy).

A ref always names the same bytes, so what was loaded once stays true. Loads are single
flight: the preview batches of a run that ask for the same spec at once wait for one load
instead of each reading and parsing it. A load that raises is not remembered. A cache given
a ``weigh`` also keeps its values' weight (their stored bytes, say) within a budget: a spec of
10,000 resources parsed takes 25 MB, and a count alone let a worker that served a few
big stacks hold hundreds of MB of specs it might never read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class RefCache(Generic[K, T]):
    """The ``size`` most recently used values, by ref; each loaded by one thread at a time.
    With ``weigh``: also no more than ``budget`` of their weights in all, the most recent
    value kept whatever it weighs."""

    def __init__(self, size: int, weigh: Callable[[T], int] | None = None, budget: int = 0) -> None:
        self._size = size
        self._weigh = weigh
        self._budget = budget
        self._weights: dict[K, int] = {}
        self._held = 0
        self._values: OrderedDict[K, T] = OrderedDict()
        self._loading: dict[K, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, ref: K, load: Callable[[K], T]) -> T:
        with self._lock:
            if ref in self._values:
                self._values.move_to_end(ref)
                return self._values[ref]
            loading = self._loading.setdefault(ref, threading.Lock())
        with loading:
            with self._lock:
                if ref in self._values:
                    return self._values[ref]
            try:
                value = load(ref)
            finally:
                with self._lock:
                    self._loading.pop(ref, None)
            self.put(ref, value)
            return value

    def put(self, ref: K, value: T) -> None:
        """Hold ``value`` for ``ref`` as the most recent one (what this process just stored
        under it: nobody need load it again here), dropping the oldest over the size or
        the budget."""
        weight = self._weigh(value) if self._weigh is not None else 0
        with self._lock:
            self._values[ref] = value
            self._values.move_to_end(ref)
            self._held += weight - self._weights.get(ref, 0)
            self._weights[ref] = weight
            while len(self._values) > self._size or (
                self._held > self._budget and self._weigh is not None and len(self._values) > 1
            ):
                old, _ = self._values.popitem(last=False)
                self._held -= self._weights.pop(old, 0)

    @property
    def held(self) -> int:
        """The weight of the values held now."""
        return self._held
