"""The advisory locks a Terraform command takes: ``file_locks`` (per file, the provider
installs) and ``resource_locks`` (a byte per resource of the stack's one lock file)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.terraform import cli
from stackflow.runtimes.terraform.cli import RANGE_LOCKS, file_locks, lock_offset, resource_locks

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""
HOLD_BYTE = """
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[3]), 1, 0)
fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, lock)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def forbid_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a free lock went through a thread")

    monkeypatch.setattr(cli.asyncio, "to_thread", no_thread)


@contextlib.contextmanager
def held_by_another_process(script: str, path: Path, *more: str) -> Iterator[None]:
    """``script`` holds its lock on ``path`` in another process for 0.6 s."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(path), "0.6", *more], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


@contextlib.asynccontextmanager
async def loop_ticks() -> AsyncIterator[list[int]]:
    """How often the event loop ran a 20 ms sleep meanwhile (one counter, in a list)."""
    ticks = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.02)
            ticks[0] += 1

    ticker = asyncio.ensure_future(tick())
    try:
        yield ticks
    finally:
        ticker.cancel()


async def test_free_locks_are_taken_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_threads(monkeypatch)
    paths = [tmp_path / f"w{i:03d}" / "lock" for i in range(200)]
    async with file_locks(paths):
        assert all(p.exists() for p in paths)
    async with file_locks(paths):  # released: free again
        pass


async def test_a_lock_another_process_holds_is_waited_for_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    held = tmp_path / "b" / "lock"
    held.parent.mkdir()
    with held_by_another_process(HOLD, held):
        async with loop_ticks() as ticks:
            started = time.monotonic()
            async with file_locks([tmp_path / "a" / "lock", held, tmp_path / "c" / "lock"]):
                waited = time.monotonic() - started
    assert waited >= 0.3  # it waited for the holder to end
    assert ticks[0] >= 10  # the loop went on meanwhile


async def test_resource_locks_are_bytes_of_one_file_taken_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_threads(monkeypatch)
    ids = [f"builtin:terraform:terraform_data:r{i:03d}" for i in range(200)]
    async with resource_locks(tmp_path / "stack", ids):
        assert [p.name for p in (tmp_path / "stack").iterdir()] == [RANGE_LOCKS]
    async with resource_locks(tmp_path / "stack", ids):  # released: free again
        pass


async def test_a_resource_another_holds_is_waited_for_and_others_are_not(
    tmp_path: Path,
) -> None:
    """Held by another process: waited for while the loop goes on. Held by another task of
    this process: waited for too (the locks belong to an open file, not to the process). A
    resource nobody holds is taken at once."""
    stack = tmp_path / "stack"
    stack.mkdir()
    busy = "builtin:terraform:terraform_data:busy"
    with held_by_another_process(HOLD_BYTE, stack / RANGE_LOCKS, str(lock_offset(busy))):
        started = time.monotonic()
        async with resource_locks(stack, ["builtin:terraform:terraform_data:free"]):
            assert time.monotonic() - started < 0.2
        ids = ["builtin:terraform:terraform_data:a", busy]
        async with loop_ticks() as ticks, resource_locks(stack, ids):
            waited = time.monotonic() - started
    assert waited >= 0.3  # it waited for the holder to end
    assert ticks[0] >= 10  # the loop went on meanwhile

    order: list[str] = []

    async def hold(name: str, seconds: float) -> None:
        async with resource_locks(stack, [busy]):
            order.append(f"{name} in")
            await asyncio.sleep(seconds)
            order.append(f"{name} out")

    first = asyncio.ensure_future(hold("first", 0.3))
    await asyncio.sleep(0.05)
    await asyncio.gather(first, hold("second", 0))
    assert order == ["first in", "first out", "second in", "second out"]
