"""Many writer processes on one stack: each revision is created exactly once, none torn."""

from __future__ import annotations

import multiprocessing
import random
import time
from pathlib import Path

from stackflow.store import FileRecordStore

from stackflow.errors import StackLockedError
from stackflow.release import Operation, Phase, ReleaseStore
from stackflow.spec import Resource, ResourceType

P, W = "race", "ws"
WRITERS = 6
EACH = 5


def _writer(home: str, writer: int, start: float) -> None:
    store = ReleaseStore(FileRecordStore(home))
    rng = random.Random(writer)
    while time.time() < start:
        time.sleep(0.001)
    made = 0
    while made < EACH:
        try:
            release = store.create(P, W, Operation.apply, None)
        except StackLockedError:
            time.sleep(rng.uniform(0.0005, 0.003))
            continue
        rev = release.revision
        store.set_phase(P, W, rev, Phase.applying)
        store.record_resource(
            P, W, rev, Resource(id=f"w{writer}", type=ResourceType.OnPrem, attributes={"n": made})
        )
        final = Phase.succeeded if made % 2 == 0 else Phase.failed
        store.set_phase(P, W, rev, final, changes={"writer": writer, "seq": made})
        made += 1


def test_processes_never_share_a_revision(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    ctx = multiprocessing.get_context("fork")
    start = time.time() + 0.3
    procs = [ctx.Process(target=_writer, args=(home, w, start)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    store = ReleaseStore(FileRecordStore(home))
    releases = store.list(P, W)
    assert [r.revision for r in releases] == list(range(1, WRITERS * EACH + 1))
    tags = sorted((r.changes or {})["writer"] * 100 + (r.changes or {})["seq"] for r in releases)
    assert tags == sorted(w * 100 + s for w in range(WRITERS) for s in range(EACH))
    assert all(r.phase.is_final for r in releases)
    # every release carried the state forward: the last one holds every writer's resource
    assert sorted(r.id for r in releases[-1].state.resources) == sorted(
        f"w{w}" for w in range(WRITERS)
    )
