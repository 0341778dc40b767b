"""Filesystem specifics: Kusion's layout, atomic writes, torn journals, killed writers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stackflow.config import default_release_store, stackflow_home
from stackflow.release import Operation, Phase, ReleaseStore
from stackflow.spec import Resource, ResourceType, Spec
from stackflow.store import FileRecordStore

P, W = "proj", "dev"


def res(rid: str, **attrs: object) -> Resource:
    return Resource(id=rid, type=ResourceType.OnPrem, attributes=dict(attrs))


def test_layout_is_kusions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFLOW_HOME", str(tmp_path / "sf"))
    assert stackflow_home() == tmp_path / "sf"
    store = default_release_store()
    assert not (tmp_path / "sf").exists()  # nothing until a write
    store.create(P, W, Operation.apply, Spec(resources=[res("a")]))
    store.record_resource(P, W, 1, res("a", x=1))
    directory = tmp_path / "sf" / "releases" / P / W
    assert (directory / "1.yaml").is_file()
    assert (directory / "1.journal.jsonl").is_file()
    store.set_phase(P, W, 1, Phase.succeeded)
    assert not (directory / "1.journal.jsonl").exists()
    data = yaml.safe_load((directory / "1.yaml").read_text())
    assert list(data) == ["metadata", "spec"]
    assert data["spec"]["state"]["resources"][0]["attributes"] == {"x": 1}
    assert data["spec"]["revision"] == 1 and data["spec"]["phase"] == "succeeded"
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "1.yaml"]  # no temp files
    monkeypatch.delenv("STACKFLOW_HOME")
    assert stackflow_home() == Path.home() / ".stackflow"


def test_metadata_read_stops_before_spec(file_releases: ReleaseStore) -> None:
    file_releases.create(P, W, Operation.apply, Spec(resources=[res("a")]))
    store = file_releases.store
    assert isinstance(store, FileRecordStore)
    path = store.record_path("Release", f"{P}/{W}", "1")
    text = path.read_text()
    # corrupt the spec part: a full read fails, the metadata read does not
    path.write_text(text.split("\nspec:")[0] + "\nspec: [unclosed\n")
    assert store.get_metadata("Release", f"{P}/{W}", "1").labels["phase"] == "generating"


def test_torn_journal_line_is_skipped_and_healed(file_releases: ReleaseStore) -> None:
    file_releases.create(P, W, Operation.apply, Spec(resources=[res("a"), res("b")]))
    file_releases.record_resource(P, W, 1, res("a", v=1))
    store = file_releases.store
    assert isinstance(store, FileRecordStore)
    journal = store.journal_path("Release", f"{P}/{W}", "1")
    with open(journal, "ab") as fh:
        fh.write(b'{"op":"upsert","resource":{"id":"b","ty')  # a crash mid-append
    assert [r.id for r in file_releases.get(P, W, 1).state.resources] == ["a"]
    file_releases.record_resource(P, W, 1, res("b", v=1))  # appends on a fresh line
    assert [r.id for r in file_releases.get(P, W, 1).state.resources] == ["a", "b"]
    assert file_releases.resource_state(P, W, 1, "b") == res("b", v=1)


def _rewrite_forever(home: str, started: Any) -> None:
    store = ReleaseStore(FileRecordStore(home))
    i = 0
    while True:
        i += 1
        store.set_phase(P, W, 1, Phase.applying, changes={"i": i, "pad": "x" * 20000})
        store.record_resource(P, W, 1, res(f"r{i % 50}", i=i))
        started.set()


def test_killed_writer_leaves_release_readable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = ReleaseStore(FileRecordStore(home))
    big = Spec(resources=[res(f"r{i}", blob="y" * 500) for i in range(300)])
    store.create(P, W, Operation.apply, big)
    ctx = multiprocessing.get_context("fork")
    for delay in (0.01, 0.1, 0.2):
        started = ctx.Event()
        child = ctx.Process(target=_rewrite_forever, args=(str(home), started))
        child.start()
        assert started.wait(timeout=30)
        time.sleep(delay)
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        release = store.get(P, W, 1)  # parses: the file is whole, the journal tolerant
        assert release.phase is Phase.applying and len(release.spec.resources) == 300  # type: ignore[union-attr]
        assert (release.changes or {}).get("i", 0) >= 1
    assert store.revisions(P, W) == [1]  # leftover temp files are not releases
    final = store.set_phase(P, W, 1, Phase.failed, error="killed")
    assert final.phase is Phase.failed
