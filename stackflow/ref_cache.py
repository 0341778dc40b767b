"""A per-process cache of what a content-addressed ref names (a spec, a plan), or of a
verdict on it (a spec that passed the worker policy).

A ref always names the same bytes, so what was loaded once stays true. Loads are single
flight: the preview batches of a run that ask for the same spec at once wait for one load
instead of each reading and parsing it. A load that raises is not remembered.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class RefCache(Generic[K, T]):
    """The ``size`` most recently used values, by ref; each loaded by one thread at a time."""

    def __init__(self, size: int) -> None:
        self._size = size
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
            with self._lock:
                self._values[ref] = value
                while len(self._values) > self._size:
                    self._values.popitem(last=False)
            return value
