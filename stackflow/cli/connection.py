"""The CLI's Temporal connection, and how it rides out a Temporal outage.

Every Temporal call a command makes goes through ``Temporal.call``: when Temporal is
unreachable (refused connection, transport error, UNAVAILABLE / DEADLINE_EXCEEDED) the call
waits, probes with backoff and retries once Temporal answers again, for up to
``--unavailable-timeout`` seconds of one outage; past that the command ends with one
``TemporalUnreachable`` line (exit 1). ``connection_error`` maps whatever connection error
escapes a command to one such line (the command group calls it, once for every command); it,
the settings and the error classes are :mod:`stackflow.temporal.client`'s, shared with
``stackflow serve``.

Starting a run is made safe to retry: each start carries a token in the run's memo, so a
retried start whose first attempt reached the server recognises that run as its own and
follows it instead of starting a second one or reporting the stack busy.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.refs import StackRef
from stackflow.temporal.client import (
    START_TOKEN,
    TemporalUnreachable,
    is_unreachable,
    quiet_runtime,
    reason,
    settings,
)
from stackflow.temporal.client import connect as temporal_connect

T = TypeVar("T")

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 5.0
PROBE_TIMEOUT = timedelta(seconds=5)
CONNECTED_ATTEMPT = 30.0
"""A call that failed after running this long was talking to Temporal until then (the SDK's
own retries give up within about 10 s): its failure starts a new outage."""


def _notice(text: str) -> None:
    """A progress note on stderr, for a person at a terminal only (scripts get the one
    ``Error:`` line or nothing)."""
    if sys.stderr.isatty():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class Temporal:
    """One command's Temporal connection: connect and call, riding out outages.

    ``timeout`` bounds one outage (seconds without an answer); ``follow`` says how to follow
    the run from another command, and ``run_started`` is set once a run is known to exist, so
    the final line says the run goes on and how to follow it.
    """

    def __init__(
        self,
        timeout: float,
        stack: StackRef | None = None,
        follow: str | None = None,
    ) -> None:
        self.address, self.namespace, self.task_queue = settings()
        self.timeout = timeout
        self.stack = stack
        self.follow = follow or (
            f"follow it with `stackflow status {stack.cli_flags}` once Temporal is back"
            if stack is not None
            else ""
        )
        self.run_started = False
        self._client: Client | None = None
        self._waiting = False

    @property
    def client(self) -> Client:
        assert self._client is not None, "connect() first"
        return self._client

    async def connect(self) -> Client:
        from stackflow.temporal import tracing
        from stackflow.temporal.codec import data_converter

        async def connect() -> Client:
            if self._client is None:
                self._client = await temporal_connect(
                    data_converter(command=True),
                    address=self.address,
                    namespace=self.namespace,
                    runtime=quiet_runtime(),
                    interceptors=tracing.interceptors(tracing.CLI),  # STACKFLOW_TRACING=otlp
                )
            return self._client

        return await self._retrying("connect", connect, probe=connect)

    async def call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()``, retried while Temporal is unreachable (up to ``timeout`` per outage)."""
        await self.connect()
        return await self._retrying(what, fn, probe=self._probe)

    async def _probe(self) -> None:
        await self.client.workflow_service.get_system_info(
            GetSystemInfoRequest(), retry=False, timeout=PROBE_TIMEOUT
        )

    async def _retrying(
        self, what: str, fn: Callable[[], Awaitable[T]], probe: Callable[[], Awaitable[Any]]
    ) -> T:
        down_since: float | None = None
        while True:
            began = time.monotonic()
            try:
                return await fn()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                now = time.monotonic()
                if now - began > CONNECTED_ATTEMPT:
                    down_since = now  # it talked to Temporal until now: a new outage
                elif down_since is None:
                    down_since = began  # its own retries already failed since it began
                await self._wait_for_temporal(what, exc, probe, down_since)

    async def _wait_for_temporal(
        self,
        what: str,
        exc: BaseException,
        probe: Callable[[], Awaitable[Any]],
        down_since: float,
    ) -> None:
        """Back off and probe until Temporal answers; raise TemporalUnreachable once the
        outage that began at ``down_since`` has lasted ``timeout`` seconds."""
        if not self._waiting:
            self._waiting = True
            _notice(
                f"Temporal at {self.address} is unreachable ({reason(exc)}); retrying for "
                f"up to {self.timeout:g}s (--unavailable-timeout)"
            )
        delay = BACKOFF_FIRST
        while True:
            left = self.timeout - (time.monotonic() - down_since)
            if left <= 0:
                raise self.unreachable(what, exc) from None
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, BACKOFF_MAX)
            try:
                await probe()
            except Exception as again:
                if not is_unreachable(again):
                    raise
                exc = again
                continue
            if self._waiting:
                self._waiting = False
                _notice(f"Temporal at {self.address} answers again; continuing")
            return

    def unreachable(self, what: str, exc: BaseException) -> TemporalUnreachable:
        head = (
            f"Temporal at {self.address} unreachable for {self.timeout:g}s "
            f"(--unavailable-timeout) during {what} ({reason(exc)})"
        )
        if self.run_started and self.stack is not None:
            return TemporalUnreachable(f"{head}; the run continues on the server: {self.follow}")
        if what == "start" and self.stack is not None:
            return TemporalUnreachable(
                f"{head}; the run may have started on the server: {self.follow}"
            )
        return TemporalUnreachable(
            f"{head}; start it (`make up`) or set TEMPORAL_ADDRESS, and run the command again"
        )

    async def start(
        self, workflow: str, arg: Any, *, id: str, result_type: type[T], **options: Any
    ) -> WorkflowHandle[Any, T]:
        """Start ``workflow`` once, safely retried: a retry after an attempt that may have
        reached the server first looks for a run carrying this start's token and follows
        it. Raises WorkflowAlreadyStartedError when another run holds the id."""
        token = uuid.uuid4().hex
        attempts = 0

        async def attempt() -> WorkflowHandle[Any, T]:
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                ours = await self._run_with_token(id, None, token, result_type)
                if ours is not None:
                    return ours
            try:
                return await self.client.start_workflow(
                    workflow,
                    arg,
                    id=id,
                    task_queue=self.task_queue,
                    result_type=result_type,
                    memo={START_TOKEN: token},
                    **options,
                )
            except WorkflowAlreadyStartedError as exc:
                if attempts > 1:
                    ours = await self._run_with_token(id, exc.run_id, token, result_type)
                    if ours is not None:
                        return ours
                raise

        handle = await self.call("start", attempt)
        self.run_started = True
        return handle

    async def _run_with_token(
        self, workflow_id: str, run_id: str | None, token: str, result_type: type[T]
    ) -> WorkflowHandle[Any, T] | None:
        """The run of ``workflow_id`` (its latest, or ``run_id``) if it carries ``token``."""
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        try:
            described = await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        if await described.memo_value(START_TOKEN, None) != token:
            return None
        return self.client.get_workflow_handle(
            workflow_id, run_id=described.run_id, result_type=result_type
        )

    def background(self, what: str, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """``call(what, fn)`` as a task whose failure never goes unretrieved (asyncio would
        log it with a traceback at exit)."""
        task = asyncio.ensure_future(self.call(what, fn))
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
        return task
