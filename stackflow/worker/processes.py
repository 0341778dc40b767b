"""``stackflow worker --processes N``: N worker processes on one host, and one that supervises
them.

A Python process runs one thread of Python at a time, and a worker's activities (runtime
calls, diffs, state writes, events) are mostly Python: one worker process uses about one core
however many runs it serves. N processes on the same task queues share the runs' workflow
tasks and activities through Temporal, as N workers on N hosts would; nothing else is shared
but what every worker shares already (the state backend, Redis, the Terraform working
directories, whose locks are held across processes).

The supervisor checks the settings once (worker policy, keys, routing, Worker Versioning)
and fails as a single worker would before any process starts; then it starts N
``python -m stackflow.worker`` processes with ``STACKFLOW_WORKER_PROCESSES=1`` and their
index (``STACKFLOW_WORKER_INDEX``), passes SIGTERM and SIGINT on (each process drains as a
single worker does), and when one ends on its own it stops the others and exits with that
one's code, so the service manager restarts the whole. With a metrics address
``HOST:PORT``, process i serves ``HOST:PORT+i``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from types import FrameType

from stackflow.core.errors import StackflowError

PROCESSES_ENV = "STACKFLOW_WORKER_PROCESSES"
INDEX_ENV = "STACKFLOW_WORKER_INDEX"
MAX_PROCESSES = 64
STOP_SECONDS = 30.0
"""How long stopped processes get to drain (each waits at most its graceful shutdown) before
they are killed."""


class ProcessesError(StackflowError):
    """``--processes`` or ``STACKFLOW_WORKER_PROCESSES`` is not a number of processes."""


def process_count(raw: str | None) -> int:
    """The number of worker processes ``raw`` asks for: a number from 1 to 64, or ``auto``
    (one per CPU this process may run on); unset or empty: 1."""
    text = (raw or "").strip().lower()
    if not text:
        return 1
    if text == "auto":
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        cpus = len(usable) if usable is not None else (os.cpu_count() or 1)
        return max(1, min(MAX_PROCESSES, cpus))
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_PROCESSES:
        raise ProcessesError(
            f"worker processes {raw!r}: give a number from 1 to {MAX_PROCESSES} or 'auto' "
            f"(--processes or {PROCESSES_ENV})"
        )
    return count


def metrics_addresses(address: str | None, count: int) -> list[str | None]:
    """Each process's metrics address: ``HOST:PORT+i`` for process i (None: no metrics)."""
    if not address:
        return [None] * count
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) + count - 1 > 65535:
        raise ProcessesError(
            f"metrics address {address!r}: with {count} worker processes give HOST:PORT, and "
            f"the ports PORT to PORT+{count - 1} must exist (process i serves PORT+i)"
        )
    return [f"{host}:{int(port) + i}" for i in range(count)]


def child_env(
    environ: Mapping[str, str], index: int, count: int, metrics_address: str | None
) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k != "STACKFLOW_METRICS_ADDRESS"}
    env[PROCESSES_ENV] = "1"
    env[INDEX_ENV] = f"{index}/{count}"
    if metrics_address:
        env["STACKFLOW_METRICS_ADDRESS"] = metrics_address
    return env


def describe_index(environ: Mapping[str, str]) -> str | None:
    """``process I of N`` for a process a supervisor started (None: a worker on its own)."""
    raw = environ.get(INDEX_ENV, "")
    index, _, count = raw.partition("/")
    if not index.isdigit() or not count.isdigit():
        return None
    return f"process {int(index) + 1} of {count}, pid {os.getpid()}"


async def stop_when_orphaned(stop: asyncio.Event, every: float = 1.0) -> None:
    """A process a supervisor started stops, as on SIGTERM, once that supervisor is gone
    (killed with SIGKILL, say): it never polls on alone with nobody to stop it."""
    parent = os.getppid()  # may be 1: a supervisor that is a container's first process
    while not stop.is_set():
        if os.getppid() != parent:
            print("stackflow worker: its supervisor is gone; stopping", flush=True)
            stop.set()
            return
        await asyncio.sleep(every)


def supervise(count: int, runtimes: str | None, metrics_address: str | None) -> int:
    """Start ``count`` worker processes and watch them; the exit code for this process."""
    addresses = metrics_addresses(metrics_address, count)
    if runtimes:
        os.environ["STACKFLOW_WORKER_RUNTIMES"] = runtimes
    children: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def terminate_living() -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        terminate_living()

    # before the first process starts: a stop during the starts stops what started
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    for i in range(count):
        if stopping:
            break
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "stackflow.worker"],
                env=child_env(os.environ, i, count, addresses[i]),
            )
        )
    print(
        f"stackflow worker: {count} processes (pids {', '.join(str(c.pid) for c in children)})",
        flush=True,
    )
    ended = None
    while ended is None and children:
        ended = next((c for c in children if c.poll() is not None), None)
        if ended is None:
            time.sleep(0.2)
    if ended is None:  # stopped before any started
        return 0
    if not stopping:
        print(
            f"stackflow worker: process {ended.pid} exited with code {ended.returncode}; "
            "stopping the others",
            file=sys.stderr,
            flush=True,
        )
        terminate_living()
    deadline = time.monotonic() + STOP_SECONDS
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if stopping:
        return 0
    return ended.returncode if ended.returncode > 0 else 1
