"""The one suite every RecordStore backend must pass (parametrised in conftest.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from stackflow.errors import (
    ConflictError,
    InvalidNameError,
    NotFoundError,
    OwnerConflictError,
    PhaseConflictError,
)
from stackflow.store import Metadata, Record, RecordPhase, RecordStore

T = TypeVar("T")
NS = "proj/ws"


def rec(
    rid: str = "r1", owner: str = "me", labels: dict[str, str] | None = None, **spec: object
) -> Record:
    return Record(
        metadata=Metadata(namespace=NS, type="Thing", id=rid, owner=owner, labels=labels or {}),
        spec=dict(spec),
    )


def retry(fn: Callable[[], T]) -> T:
    while True:
        try:
            return fn()
        except ConflictError as err:
            if isinstance(err, OwnerConflictError | PhaseConflictError):
                raise


def test_missing_record(record_store: RecordStore) -> None:
    with pytest.raises(NotFoundError):
        record_store.get("Thing", NS, "nope")
    with pytest.raises(NotFoundError):
        record_store.destroy("Thing", NS, "nope", "me")
    with pytest.raises(NotFoundError):
        record_store.update(rec("nope"))
    assert record_store.list("Thing", NS) == []
    assert record_store.ids("Thing", NS) == []


def test_create_get_and_create_twice(record_store: RecordStore) -> None:
    created = record_store.create(rec(a=1))
    assert created.metadata.version == 1
    assert created.metadata.phase is RecordPhase.running
    assert (
        created.metadata.created is not None
        and created.metadata.created == created.metadata.updated
    )
    got = record_store.get("Thing", NS, "r1")
    assert got == created and got.spec == {"a": 1}
    assert record_store.get_metadata("Thing", NS, "r1") == created.metadata
    with pytest.raises(ConflictError):
        record_store.create(rec(a=2))
    assert record_store.get("Thing", NS, "r1").spec == {"a": 1}


def test_update_is_compare_and_swap(record_store: RecordStore) -> None:
    current = record_store.create(rec(a=1))
    stale = current.model_copy(deep=True)
    future = current.model_copy(deep=True)
    future.metadata.version = 5
    with pytest.raises(ConflictError, match="version 5 is not the current version 1"):
        record_store.update(future)
    current.spec = {"a": 2}
    updated = record_store.update(current)
    assert updated.metadata.version == 2 and updated.spec == {"a": 2}
    assert updated.metadata.created == current.metadata.created
    stale.spec = {"a": 3}
    with pytest.raises(ConflictError):
        record_store.update(stale)  # version 1 is stale now
    assert record_store.get("Thing", NS, "r1").spec == {"a": 2}


def test_owner_is_checked_before_version(record_store: RecordStore) -> None:
    record_store.create(rec(owner="me"))
    intruder = rec(owner="you")
    intruder.metadata.version = 99  # wrong version too: the owner error wins
    with pytest.raises(OwnerConflictError, match="owned by 'me', not 'you'"):
        record_store.update(intruder)
    with pytest.raises(OwnerConflictError):
        record_store.destroy("Thing", NS, "r1", "you")
    with pytest.raises(OwnerConflictError):
        record_store.teardown("Thing", NS, "r1", "you")
    record_store.get("Thing", NS, "r1")


def test_finalizers_block_destroy(record_store: RecordStore) -> None:
    record_store.create(rec())
    record_store.add_finalizer("Thing", NS, "r1", "cleanup")
    record_store.add_finalizer("Thing", NS, "r1", "cleanup")  # idempotent
    assert record_store.get("Thing", NS, "r1").metadata.finalizers == ["cleanup"]
    with pytest.raises(ConflictError, match="has finalizers cleanup"):
        record_store.destroy("Thing", NS, "r1", "me")
    record_store.remove_finalizer("Thing", NS, "r1", "cleanup")
    record_store.destroy("Thing", NS, "r1", "me")
    with pytest.raises(NotFoundError):
        record_store.get("Thing", NS, "r1")


def test_teardown_phase(record_store: RecordStore) -> None:
    record_store.create(rec())
    record_store.add_finalizer("Thing", NS, "r1", "f")
    torn = record_store.teardown("Thing", NS, "r1", "me")
    assert torn.metadata.phase is RecordPhase.tearingDown
    with pytest.raises(PhaseConflictError):
        record_store.update(torn)
    with pytest.raises(PhaseConflictError):
        record_store.add_finalizer("Thing", NS, "r1", "g")
    record_store.remove_finalizer("Thing", NS, "r1", "f")  # allowed while tearing down
    record_store.destroy("Thing", NS, "r1", "me")


def test_add_remove_finalizer_races_lose_nothing(record_store: RecordStore) -> None:
    record_store.create(rec())
    for i in range(3):
        record_store.add_finalizer("Thing", NS, "r1", f"old{i}")
    start = threading.Barrier(11)

    def add(i: int) -> None:
        start.wait()
        retry(lambda: record_store.add_finalizer("Thing", NS, "r1", f"new{i}"))

    def remove(i: int) -> None:
        start.wait()
        retry(lambda: record_store.remove_finalizer("Thing", NS, "r1", f"old{i}"))

    with ThreadPoolExecutor(11) as pool:
        futures = [pool.submit(add, i) for i in range(8)] + [
            pool.submit(remove, i) for i in range(3)
        ]
        for f in futures:
            f.result()
    final = record_store.get("Thing", NS, "r1").metadata
    assert sorted(final.finalizers) == [f"new{i}" for i in range(8)]
    assert final.version == 1 + 3 + 11


def test_cas_increments_lose_nothing(record_store: RecordStore) -> None:
    record_store.create(rec(count=0))
    start = threading.Barrier(8)

    def bump() -> None:
        start.wait()
        for _ in range(5):

            def attempt() -> Record:
                current = record_store.get("Thing", NS, "r1")
                current.spec["count"] = int(str(current.spec["count"])) + 1
                return record_store.update(current)

            retry(attempt)

    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(bump) for _ in range(8)]:
            f.result()
    assert record_store.get("Thing", NS, "r1").spec["count"] == 40


def test_concurrent_destroys(record_store: RecordStore) -> None:
    record_store.create(rec())
    start = threading.Barrier(10)

    def destroy() -> str:
        start.wait()
        try:
            record_store.destroy("Thing", NS, "r1", "me")
            return "ok"
        except NotFoundError:
            return "not found"

    with ThreadPoolExecutor(10) as pool:
        results = [f.result() for f in [pool.submit(destroy) for _ in range(10)]]
    assert results.count("ok") == 1 and results.count("not found") == 9


def test_list_sorted_and_filtered(record_store: RecordStore) -> None:
    for rid in ["10", "9", "b", "2", "a"]:
        record_store.create(rec(rid, labels={"parity": "odd" if rid in ("9", "b") else "even"}))
    assert [r.metadata.id for r in record_store.list("Thing", NS)] == ["2", "9", "10", "a", "b"]
    assert record_store.ids("Thing", NS) == ["2", "9", "10", "a", "b"]
    odd = record_store.list("Thing", NS, labels={"parity": "odd"})
    assert [r.metadata.id for r in odd] == ["9", "b"]
    assert record_store.list("Thing", NS, labels={"parity": "odd", "x": "y"}) == []
    assert record_store.list("Thing", "other/ns") == []
    assert record_store.list("Other", NS) == []


def test_labels_are_updated(record_store: RecordStore) -> None:
    current = record_store.create(rec(labels={"a": "1"}))
    current.metadata.labels = {"a": "2"}
    record_store.update(current)
    assert record_store.get_metadata("Thing", NS, "r1").labels == {"a": "2"}


def test_journal(record_store: RecordStore) -> None:
    assert record_store.read_journal("Thing", NS, "r1") == []
    record_store.append_journal("Thing", NS, "r1", {"n": 1, "nested": {"x": [1]}})
    record_store.append_journal("Thing", NS, "r1", {"n": 2})
    entries = record_store.read_journal("Thing", NS, "r1")
    assert entries == [{"n": 1, "nested": {"x": [1]}}, {"n": 2}]
    entries[0]["n"] = 99  # a copy
    assert record_store.read_journal("Thing", NS, "r1")[0]["n"] == 1
    record_store.clear_journal("Thing", NS, "r1")
    assert record_store.read_journal("Thing", NS, "r1") == []


@pytest.mark.parametrize(
    ("type_", "namespace", "rid"),
    [
        ("Thing", "../etc", "x"),
        ("Thing", "a//b", "x"),
        ("Thing", NS, "../x"),
        ("../T", NS, "x"),
        ("Thing", "", "x"),
        ("Thing", NS, "a/b"),
    ],
)
def test_unsafe_names_refused(
    record_store: RecordStore, type_: str, namespace: str, rid: str
) -> None:
    with pytest.raises(InvalidNameError):
        record_store.get(type_, namespace, rid)
    record = Record(metadata=Metadata(namespace=namespace, type=type_, id=rid, owner="me"))
    with pytest.raises(InvalidNameError):
        record_store.create(record)
