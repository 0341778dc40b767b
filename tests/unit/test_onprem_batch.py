"""OnPrem calls made at once run as one batch: each call keeps its own outcome, a path named
twice is written in order, and nothing is renamed into place before every new content of the
batch is durable; the directory is synced once, after the renames."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.onprem import OnPremRuntime
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy
from stackflow.runtimes.turns import TurnBatcher
from tests.unit.test_runtime_policy import onprem_policy

OPTS = RuntimeOptions(project="p", workspace="w")


def policy_for(tmp_path: Path) -> WorkerPolicy:
    return onprem_policy(tmp_path)  # roots: tmp_path/root, files at most 1 KiB


def request(path: Path, content: str = "x\n", rid: str | None = None) -> ResourceRequest:
    return ResourceRequest(
        id=rid or f"onprem:File:{path}",
        type="OnPrem",
        attributes={"kind": "File", "path": str(path), "content": content},
    )


class Runs:
    """Counts the runtime's batches (and their sizes) while passing them on."""

    def __init__(self, runtime: OnPremRuntime) -> None:
        self.sizes: list[int] = []
        self.threads: set[int] = set()
        inner = runtime._batches._run

        def counted(jobs: list[Any]) -> None:
            self.sizes.append(len(jobs))
            self.threads.add(threading.get_ident())
            inner(jobs)

        runtime._batches._run = counted


async def test_calls_made_at_once_run_as_one_batch_each_with_its_own_outcome(
    tmp_path: Path,
) -> None:
    rt = OnPremRuntime(policy_for(tmp_path))
    runs = Runs(rt)
    root = tmp_path / "root"
    wanted = [request(root / "d" / f"f{i}.txt", f"content {i}\n") for i in range(30)]
    refused = request(tmp_path / "outside.txt")
    too_big = request(root / "big.txt", "x" * 2000)
    calls = [rt.apply(r, OPTS) for r in wanted] + [rt.apply(refused, OPTS), rt.apply(too_big, OPTS)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert runs.sizes == [32]  # one batch, one thread hop
    assert threading.get_ident() not in runs.threads  # not on the event loop's thread
    for r, live in zip(wanted, results[:30], strict=True):
        assert isinstance(live, dict) and live["content"] == r.attributes["content"]
        assert Path(r.attributes["path"]).read_text() == r.attributes["content"]
    assert isinstance(results[30], PolicyViolation) and "outside" in str(results[30])
    assert isinstance(results[31], PolicyViolation) and "attributes.content" in str(results[31])
    assert not (root / "big.txt").exists()
    assert sorted(os.listdir(root / "d")) == sorted(f"f{i}.txt" for i in range(30))
    # reads and deletes of the same files, also at once
    lives = await asyncio.gather(*(rt.read(r, OPTS) for r in wanted))
    assert [live and live["content"] for live in lives] == [f"content {i}\n" for i in range(30)]
    await asyncio.gather(*(rt.delete(r, OPTS) for r in wanted))
    assert os.listdir(root / "d") == []
    assert runs.sizes == [32, 30, 30]


async def test_a_path_named_twice_in_one_batch_is_written_in_order(tmp_path: Path) -> None:
    rt = OnPremRuntime(policy_for(tmp_path))
    target = tmp_path / "root" / "same.txt"
    first, second = request(target, "one\n", "a"), request(target, "two\n", "b")
    one, two = await asyncio.gather(rt.apply(first, OPTS), rt.apply(second, OPTS))
    assert one["content"] == "one\n" and two["content"] == "two\n"
    assert target.read_text() == "two\n"
    assert os.listdir(target.parent) == ["same.txt"]  # no temporary file left


async def test_every_new_content_is_durable_before_any_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order of the disk waits and renames of a batch of three new files and one
    unchanged file: three file syncs, then three renames, then one sync of the directory."""
    rt = OnPremRuntime(policy_for(tmp_path))
    root = tmp_path / "root"
    (root / "same.txt").write_text("same\n")
    os.chmod(root / "same.txt", 0o644)
    seen: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        where = os.readlink(f"/proc/self/fd/{fd}")
        seen.append("sync dir" if os.path.isdir(where) else "sync file")
        real_fsync(fd)

    def replace(*args: Any, **kwargs: Any) -> None:
        seen.append("rename")
        real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    news = [request(root / f"new{i}.txt", f"{i}\n") for i in range(3)]
    await asyncio.gather(
        *(rt.apply(r, OPTS) for r in [*news, request(root / "same.txt", "same\n")])
    )
    assert seen == ["sync file"] * 3 + ["rename"] * 3 + ["sync dir"]
    assert [(root / f"new{i}.txt").read_text() for i in range(3)] == ["0\n", "1\n", "2\n"]


async def test_a_write_that_fails_before_its_rename_leaves_the_target_and_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = OnPremRuntime(policy_for(tmp_path))
    root = tmp_path / "root"
    (root / "bad.txt").write_text("old\n")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root / ".stackflow-")):
            size = os.fstat(fd).st_size
            if size == len("bad\n"):
                raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    good, bad = request(root / "good.txt", "good\n"), request(root / "bad.txt", "bad\n")
    results = await asyncio.gather(
        rt.apply(good, OPTS), rt.apply(bad, OPTS), return_exceptions=True
    )
    assert isinstance(results[0], dict) and (root / "good.txt").read_text() == "good\n"
    error = results[1]
    assert type(error).__name__ == "Unavailable" and "Input/output error" in str(error)
    assert (root / "bad.txt").read_text() == "old\n"  # untouched
    assert sorted(os.listdir(root)) == ["bad.txt", "good.txt"]  # its temporary file removed


# ---- the turn batcher ------------------------------------------------------------------------
async def test_jobs_of_one_turn_run_together_and_later_ones_in_the_next_batch() -> None:
    batches: list[list[int]] = []
    batcher: TurnBatcher[int] = TurnBatcher(batches.append, limit=4)
    await asyncio.gather(*(batcher.submit(i) for i in range(6)))
    assert batches == [[0, 1, 2, 3], [4, 5]]
    await batcher.submit(6)
    assert batches[-1] == [6]


async def test_a_failing_batch_reaches_every_caller_and_a_cancelled_caller_stops_no_one() -> None:
    release = threading.Event()
    ran: list[list[str]] = []

    def run(jobs: list[str]) -> None:
        release.wait(5)
        ran.append(jobs)
        if "boom" in jobs:
            raise RuntimeError("the batch failed")

    batcher: TurnBatcher[str] = TurnBatcher(run, limit=10)
    waiting = asyncio.ensure_future(batcher.submit("a"))
    other = asyncio.ensure_future(batcher.submit("b"))
    await asyncio.sleep(0.05)
    waiting.cancel()
    release.set()
    await other  # the batch ran to its end for the caller that stayed
    assert ran == [["a", "b"]]
    results = await asyncio.gather(
        batcher.submit("boom"), batcher.submit("c"), return_exceptions=True
    )
    assert [str(r) for r in results] == ["the batch failed"] * 2
