"""What a content-addressed ref names is loaded once per process, also when many ask at once,
and a failed load is not remembered."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from stackflow.ref_cache import RefCache


def test_refs_asked_at_once_are_loaded_once() -> None:
    loads: list[str] = []
    cache: RefCache[str, str] = RefCache(4)

    def load(ref: str) -> str:
        loads.append(ref)
        time.sleep(0.05)  # the others ask while this load runs
        return ref.upper()

    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda i: cache.get(f"ref{i % 2}", load), range(16)))
    assert found == [f"REF{i % 2}" for i in range(16)]
    assert sorted(loads) == ["ref0", "ref1"]


def test_the_least_recently_used_ref_goes_first_and_a_failed_load_is_tried_again() -> None:
    loads: list[str] = []
    cache: RefCache[str, str] = RefCache(2)

    def load(ref: str) -> str:
        loads.append(ref)
        return ref

    for ref in ("a", "b", "a", "c", "a", "b"):
        cache.get(ref, load)
    assert loads == ["a", "b", "c", "b"]  # b went when c came (a was used since)
    failing = threading.Event()

    def broken(ref: str) -> str:
        failing.set()
        raise OSError("the backend is down")

    with pytest.raises(OSError):
        cache.get("d", broken)
    assert failing.is_set() and cache.get("d", load) == "d"
