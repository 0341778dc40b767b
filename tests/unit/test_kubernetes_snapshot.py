"""Preview listings kept as a run's snapshot: loaded once, bounded in time and bytes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stackflow.runtimes.kubernetes.snapshot import Listing, Snapshots


def listing(size: int, **objects: dict[str, str]) -> Listing:
    found = Listing()
    for name, obj in objects.items():
        found.add(name, obj)
    found.size = size  # what the bound weighs, set apart from the objects here
    return found


def test_a_listing_keeps_json_text_and_gives_each_reader_its_own_object() -> None:
    found = Listing()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}
    found.add("a", cm)
    text = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}}'
    assert found.size == len(text) and len(found) == 1  # the bytes it holds, counted
    first = found.get("a")
    assert first == cm and first is not cm
    assert first is not None
    first["data"]["k"] = "changed by a reader"
    assert found.get("a") == cm  # the next reader still gets the object as listed
    assert found.get("b") is None
    found.add("a", {"metadata": {"name": "a"}})  # listed again: counted once
    assert found.size == len('{"metadata":{"name":"a"}}')


def test_concurrent_readers_of_one_key_share_one_load() -> None:
    snapshots = Snapshots()
    loads: list[str] = []
    gate = threading.Event()

    def load() -> Listing:
        loads.append("x")
        gate.wait(5)
        return listing(10, a={"k": "v"})

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(snapshots.get, ("run", 1, "/p"), load) for _ in range(8)]
        gate.set()
        results = [f.result() for f in futures]
    assert loads == ["x"] and all(r is results[0] for r in results)
    assert snapshots.get(("run", 1, "/p"), load) is results[0]  # kept for the run
    assert snapshots.get(("other", 1, "/p"), load) is not results[0]  # another run lists anew


def test_listings_expire_and_the_oldest_go_past_the_byte_bound() -> None:
    clock = [0.0]
    snapshots = Snapshots(seconds=10, size=100, clock=lambda: clock[0])

    def get(key: str, size: int) -> Listing | None:
        return snapshots.get((key,), lambda: listing(size))

    first = get("a", 60)
    assert get("a", 60) is first
    second = get("b", 60)  # 120 bytes held: the older one goes
    assert get("b", 60) is second and get("a", 60) is not first
    clock[0] = 11.0  # past the time bound: everything is listed anew
    assert get("b", 60) is not second
    huge = get("c", 500)  # larger than the bound: served, not kept
    assert huge is not None and get("c", 500) is not huge


def test_a_load_that_raises_is_not_kept() -> None:
    snapshots = Snapshots()

    def boom() -> Listing:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        snapshots.get(("k",), boom)
    assert snapshots.get(("k",), lambda: listing(1)) is not None
