"""activities.state.ReleaseStateReader agrees with ReleaseStore.get while a release is applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.state import ReleaseStateReader
from stackflow.release import Operation, Phase, ReleaseStore
from stackflow.spec import Resource
from stackflow.store.base import RecordStore
from stackflow.store.filesystem import FileRecordStore
from stackflow.store.memory import MemoryRecordStore


def _res(rid: str, value: str) -> Resource:
    return Resource(id=rid, type="OnPrem", attributes={"kind": "File", "path": "/x", "v": value})


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> RecordStore:
    return FileRecordStore(tmp_path) if request.param == "file" else MemoryRecordStore()


def test_reader_follows_the_journal_and_reloads_after_a_final_phase(store: RecordStore) -> None:
    releases = ReleaseStore(store)
    reader = ReleaseStateReader(releases)
    first = releases.create("p", "w", Operation.apply, None)
    releases.record_resource("p", "w", 1, _res("a", "1"))
    releases.set_phase("p", "w", 1, Phase.succeeded)

    second = releases.create("p", "w", Operation.apply, None)
    assert (first.revision, second.revision) == (1, 2)
    assert reader.resources("p", "w", 2) == releases.get("p", "w", 2).state.by_id()
    assert reader.resource("p", "w", 2, "b") is None

    releases.record_resource("p", "w", 2, _res("b", "1"))
    releases.record_resource("p", "w", 2, _res("a", "2"))
    assert reader.resource("p", "w", 2, "a") == _res("a", "2")
    releases.record_deletion("p", "w", 2, "a")
    releases.record_resource("p", "w", 2, _res("b", "2"))
    assert reader.resource("p", "w", 2, "a") is None
    assert reader.resources("p", "w", 2, ["a", "b", "zz"]) == {"b": _res("b", "2")}
    assert reader.resources("p", "w", 2) == releases.get("p", "w", 2).state.by_id()

    # the final phase folds and removes the journal: the reader notices and reloads
    releases.set_phase("p", "w", 2, Phase.succeeded)
    assert reader.resources("p", "w", 2) == {"b": _res("b", "2")}


def test_reader_skips_a_torn_last_line_until_it_is_complete(tmp_path: Path) -> None:
    store = FileRecordStore(tmp_path)
    releases = ReleaseStore(store)
    reader = ReleaseStateReader(releases)
    releases.create("p", "w", Operation.apply, None)
    releases.record_resource("p", "w", 1, _res("a", "1"))
    journal = store.journal_path("Release", "p/w", "1")
    with journal.open("ab") as fh:
        fh.write(b'{"op":"upsert","resource":{"id":"b"')  # a writer died mid-line
    assert set(reader.resources("p", "w", 1)) == {"a"}
    releases.record_resource("p", "w", 1, _res("c", "1"))  # heals the torn line first
    assert set(reader.resources("p", "w", 1)) == {"a", "c"}
    assert reader.resources("p", "w", 1) == releases.get("p", "w", 1).state.by_id()
