"""``file_locks``: the working directories' advisory locks a Terraform batch takes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.terraform import cli
from stackflow.runtimes.terraform.cli import file_locks

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


async def test_free_locks_are_taken_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a free lock went through a thread")

    monkeypatch.setattr(cli.asyncio, "to_thread", no_thread)
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
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held), "0.6"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        started = time.monotonic()
        async with file_locks([tmp_path / "a" / "lock", held, tmp_path / "c" / "lock"]):
            waited = time.monotonic() - started
        ticker.cancel()
    finally:
        holder.kill()
        holder.wait()
    assert waited >= 0.3  # it waited for the holder to end
    assert ticks >= 10  # the loop went on meanwhile
