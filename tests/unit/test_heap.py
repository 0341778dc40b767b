"""A long-running process's heap: glibc malloc arenas limited before its threads start."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from stackflow.core import heap

THREADS_ALLOCATE = """
import ctypes, sys, threading
from stackflow.core import heap
if sys.argv[1] == "limit":
    print(heap.limit_malloc_arenas({}))
barrier = threading.Barrier(8)
def work():
    barrier.wait()  # all eight at once, each with a first malloc of its own
    kept = [bytearray(2000) for _ in range(200)]  # above pymalloc's sizes: glibc's malloc
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" section per arena, on stderr
"""


def arenas_after_eight_threads(limit: bool) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", THREADS_ALLOCATE, "limit" if limit else "default"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},  # no MALLOC_ARENA_MAX from the test's environment
    )
    return done.stdout.strip(), sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_stats  # noqa: B018
    except AttributeError:
        return False
    return True


@pytest.mark.skipif(not glibc(), reason="glibc's malloc arenas (Linux)")
def test_eight_threads_share_two_arenas_once_limited() -> None:
    said, limited = arenas_after_eight_threads(limit=True)
    assert said == "True" and limited == heap.MALLOC_ARENAS
    _, default = arenas_after_eight_threads(limit=False)
    assert default > heap.MALLOC_ARENAS  # glibc's own default: an arena per thread here


def test_malloc_arena_max_set_by_the_operator_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*_: object) -> None:
        raise AssertionError("the C library is not asked")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert heap.limit_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is False
