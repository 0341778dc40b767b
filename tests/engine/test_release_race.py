"""Racing writers on one stack: the lock goes to exactly one of them at a time, each
revision is created exactly once, and no release is torn.

Processes race on one SQLite file (each with its own engine, as separate workers and CLI
invocations do); threads race on every backend through one shared engine.
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

from stackflow.core.errors import StackLockedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import Resource, ResourceType
from stackflow.state.backend import StateBackend, open_backend

P, W = "race", "ws"
STACK = StackRef(P, W)
WRITERS = 6
EACH = 5
ROUNDS = 4


def _url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_backend(url).close()  # migrated once, before the writers start
    return url


def _writer(url: str, writer: int, ready: Barrier) -> None:
    backend = open_backend(url)
    rng = random.Random(writer)
    ready.wait(timeout=60)  # every writer has its engine: they start together
    made = 0
    while made < EACH:
        run = RunRef(f"wf-{writer}", f"run-{writer}-{made}")
        try:
            release = backend.create(STACK, Operation.apply, None, run=run)
        except StackLockedError:
            time.sleep(rng.uniform(0.0005, 0.003))
            continue
        held_from = time.time()
        rev = release.revision
        lock = backend.lock(STACK)
        assert lock is not None and lock.held_by(run) and lock.revision == rev
        backend.set_phase(STACK, rev, Phase.applying, run=run)
        # fenced: raises (and the process fails) if anyone else held the stack now
        backend.record_resource(
            STACK,
            rev,
            Resource(id=f"w{writer}", type=ResourceType.OnPrem, attributes={"n": made}),
            run=run,
        )
        time.sleep(rng.uniform(0.0005, 0.002))  # hold the stack a while: others keep trying
        final = Phase.succeeded if made % 2 == 0 else Phase.failed
        changes = {"writer": writer, "seq": made, "from": held_from, "until": time.time()}
        backend.set_phase(STACK, rev, final, run=run, changes=changes)
        made += 1
    backend.close()


def test_processes_never_share_a_revision(tmp_path: Path) -> None:
    url = _url(tmp_path)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(url, w, ready)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    backend = open_backend(url)
    releases = backend.list(STACK)
    assert [r.revision for r in releases] == list(range(1, WRITERS * EACH + 1))
    changes = [r.changes or {} for r in releases]
    tags = sorted(c["writer"] * 100 + c["seq"] for c in changes)
    assert tags == sorted(w * 100 + s for w in range(WRITERS) for s in range(EACH))
    assert all(r.phase.is_final for r in releases)
    assert all(
        r.run_id == f"run-{c['writer']}-{c['seq']}" for r, c in zip(releases, changes, strict=True)
    )
    # the stack was held by one writer at a time: each hold ended before the next began
    for before, after in itertools.pairwise(changes):
        assert before["until"] <= after["from"]
    assert backend.lock(STACK) is None
    # every release carried the state forward: the last one holds every writer's resource
    last = backend.get(STACK, releases[-1].revision)
    assert sorted(r.id for r in last.state.resources) == sorted(f"w{w}" for w in range(WRITERS))
    backend.close()


def _create_once(
    url: str, writer: int, ready: Barrier, results: Queue[tuple[int, int | None]]
) -> None:
    backend = open_backend(url)
    run = RunRef("wf", f"run-{writer}")
    ready.wait(timeout=60)
    try:
        release = backend.create(STACK, Operation.apply, None, run=run)
        results.put((writer, release.revision))
    except StackLockedError:
        results.put((writer, None))
    backend.close()


def test_racing_processes_never_both_get_the_lock(tmp_path: Path) -> None:
    url = _url(tmp_path)
    backend = open_backend(url)
    ctx = multiprocessing.get_context("fork")
    for round_ in range(1, ROUNDS + 1):
        results: Queue[tuple[int, int | None]] = ctx.Queue()
        ready = ctx.Barrier(WRITERS)
        procs = [
            ctx.Process(target=_create_once, args=(url, w, ready, results)) for w in range(WRITERS)
        ]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        winners = [(w, rev) for w, rev in outcomes if rev is not None]
        assert len(winners) == 1, outcomes
        ((winner, revision),) = winners
        assert revision == round_
        lock = backend.lock(STACK)
        assert lock is not None and lock.holder() == RunRef("wf", f"run-{winner}")
        backend.set_phase(STACK, revision, Phase.succeeded, run=RunRef("wf", f"run-{winner}"))
    assert backend.revisions(STACK) == list(range(1, ROUNDS + 1))
    backend.close()


def test_racing_threads_never_both_get_the_lock(backend: StateBackend) -> None:
    for round_ in range(1, ROUNDS + 1):
        barrier = threading.Barrier(WRITERS)

        def create(writer: int, round_: int = round_, barrier: threading.Barrier = barrier) -> int:
            barrier.wait()
            try:
                run = RunRef("wf", f"run-{round_}-{writer}")
                return backend.create(STACK, Operation.apply, None, run=run).revision
            except StackLockedError:
                return 0

        with ThreadPoolExecutor(WRITERS) as pool:
            revisions = list(pool.map(create, range(WRITERS)))
        assert sorted(revisions) == [0] * (WRITERS - 1) + [round_]
        winner = RunRef("wf", f"run-{round_}-{revisions.index(round_)}")
        assert backend.lock(STACK).holder() == winner  # type: ignore[union-attr]
        backend.set_phase(STACK, round_, Phase.failed, run=winner, error="done")
    assert backend.revisions(STACK) == list(range(1, ROUNDS + 1))
