"""What one API process holds: a Temporal client (connected on first use, shared by every
request), the state backend, the token table and its limits, and the results of the runs
it last saw end (a closed run's result never changes). No state of its own beyond that
cache: two processes built from the same settings answer alike."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.concurrency import run_in_threadpool
from temporalio.client import Client, WorkflowHandle

from stackflow.api.auth import TokenTable
from stackflow.api.metrics import Metrics
from stackflow.api.stream_slots import StreamSlots
from stackflow.state.event_bell import Listener
from stackflow.state.event_feed import Feeds
from stackflow.temporal.client import TemporalUnreachable, connection_error, is_unreachable
from stackflow.temporal.operation import TASK_QUEUE_DEFAULT

if TYPE_CHECKING:
    from stackflow.core.refs import StackRef
    from stackflow.state.backend import StateBackend

T = TypeVar("T")

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body by default (``stackflow serve --max-body-bytes``)."""
FINAL_RESULTS = 64
"""Results of closed runs kept per process (each within the history's byte budget)."""
KNOWN_RUNS = 1024
"""Runs whose workflow id (and, once closed, description) a process keeps."""


@dataclass
class ApiContext:
    connect: Callable[[], Awaitable[Client]]
    """Connects to Temporal (with stackflow's data converter: the payload codec and keys)."""
    backend: StateBackend
    tokens: TokenTable
    task_queue: str = TASK_QUEUE_DEFAULT
    max_body_bytes: int = MAX_BODY_BYTES
    metrics: Metrics = field(default_factory=Metrics)
    listener: Listener = field(default_factory=lambda: Listener(None))
    """Wakes the event streams this process serves when their run's bell rings (Redis)."""
    streams: StreamSlots = field(default_factory=StreamSlots)
    feeds: Feeds = field(default_factory=Feeds)
    """The runs whose events this process's streams follow, one reader each."""
    """The event streams each caller has open here (at most ``streams.limit`` each)."""
    _client: Client | None = field(default=None, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _finals: OrderedDict[tuple[str, str], Any] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _runs: OrderedDict[tuple[str, str, str], tuple[str, Any]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    async def client(self) -> Client:
        """The shared client; TemporalUnreachable (503) while Temporal cannot be reached."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                try:
                    self._client = await self.connect()
                except Exception as exc:
                    err = connection_error(exc)
                    if err is None and not is_unreachable(exc):
                        raise
                    raise err or TemporalUnreachable(str(exc)) from None
        return self._client

    async def final_result(self, handle: WorkflowHandle[Any, Any], result_type: type[T]) -> T:
        """The result of the run ``handle`` names (waiting for it to close), as
        ``result_type``; read from Temporal's history once per process and kept, since it
        never changes: the requests that follow a run's end (its view, its preview) read
        it once. A run that did not complete raises as ``handle.result()`` does, every
        time (nothing is kept)."""
        key = (handle.id, handle.run_id or "")
        found = self._finals.get(key)
        if isinstance(found, result_type):
            self._finals.move_to_end(key)
            return found
        client = await self.client()
        typed = client.get_workflow_handle(handle.id, run_id=handle.run_id, result_type=result_type)
        result: T = await typed.result(follow_runs=False)
        self._finals[key] = result
        while len(self._finals) > FINAL_RESULTS:
            self._finals.popitem(last=False)
        return result

    def known_run(self, stack: StackRef, run_id: str) -> tuple[str, Any] | None:
        """The workflow id of the stack's run ``run_id`` and, once it has closed, its
        description (neither ever changes), if this process has seen them."""
        key = (stack.project, stack.workspace, run_id)
        found = self._runs.get(key)
        if found is not None:
            self._runs.move_to_end(key)
        return found

    def remember_run(
        self, stack: StackRef, run_id: str, workflow_id: str, closed: Any = None
    ) -> None:
        """Keep the run's workflow id (and ``closed``: its description after it closed)."""
        self._runs[(stack.project, stack.workspace, run_id)] = (workflow_id, closed)
        while len(self._runs) > KNOWN_RUNS:
            self._runs.popitem(last=False)

    async def state(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a state backend call, blocking) on a worker thread."""
        return await run_in_threadpool(fn)
