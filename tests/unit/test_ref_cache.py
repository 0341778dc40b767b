"""What a content-addressed ref names is loaded once per process, also when many ask at once,
and a failed load is not remembered."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stackflow.core.ref_cache import RefCache


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


def test_weighed_values_stay_within_the_budget_and_the_newest_is_kept() -> None:
    loads: list[str] = []
    cache: RefCache[str, str] = RefCache(16, weigh=len, budget=10)

    def load(ref: str) -> str:
        loads.append(ref)
        return ref

    cache.get("aaaa", load)
    cache.get("bbbb", load)
    assert cache.held == 8
    cache.get("aaaa", load)  # used again: now the most recent
    cache.get("cccc", load)  # 12 > 10: the least recently used ("bbbb") goes
    assert cache.held == 8 and loads == ["aaaa", "bbbb", "cccc"]
    cache.get("bbbb", load)
    assert loads[-1] == "bbbb" and cache.held == 8  # loaded again; "aaaa" went
    huge = "x" * 50
    assert cache.get(huge, load) == huge and cache.held == 50  # alone, over the budget: kept
    cache.get(huge, load)
    assert loads.count(huge) == 1
    cache.get("dddd", load)  # the oversized one goes as soon as another comes
    assert cache.held == 4


def test_the_spec_and_plan_caches_weigh_what_they_read_from_the_backend(tmp_path: Path) -> None:
    from stackflow.engine.spec import parse_spec
    from stackflow.state.backend import open_backend
    from stackflow.state.plan_store import PlanStore
    from stackflow.state.spec_store import SpecStore

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    specs, plans = SpecStore(backend), PlanStore(backend)
    spec = parse_spec(
        {"resources": [{"id": "a", "type": "OnPrem", "attributes": {"path": "/tmp/a"}}]},
        source="test",
    )
    ref = specs.put(spec)
    assert specs.resources(ref)["a"].attributes == {"path": "/tmp/a"}
    assert specs._cache.held == len(backend.get_blob("spec_ref", ref))
    plan_ref = plans.put([], [])
    assert plans.get(plan_ref).stored_bytes == len(backend.get_blob("plan_ref", plan_ref)) > 0
