"""The CLI's Temporal connection, and how it rides out a Temporal outage.

Every Temporal call a command makes goes through ``Temporal.call``: when Temporal is
unreachable (refused connection, transport error, UNAVAILABLE / DEADLINE_EXCEEDED) the call
waits, probes with backoff and retries once Temporal answers again, for up to
``--unavailable-timeout`` seconds of one outage; past that the command ends with one
``TemporalUnreachable`` line (exit 1). ``cli_error`` maps whatever connection error escapes
a command to one such line (the command group calls it, once for every command).

Starting a run is made safe to retry: each start carries a token in the run's memo, so a
retried start whose first attempt reached the server recognises that run as its own and
follows it instead of starting a second one or reporting the stack busy.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode

from stackflow.errors import StackflowError
from stackflow.operation import TASK_QUEUE_DEFAULT
from stackflow.refs import StackRef

T = TypeVar("T")

START_TOKEN = "stackflow-start"
"""Memo key of the token a CLI start puts on its run (recognises a retried start's run)."""
UNREACHABLE_CODES = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
TRANSPORT_MARKERS = (
    "tcp connect error",
    "transport error",
    "connection refused",
    "connection reset",
    "broken pipe",
    "error trying to connect",
    "dns error",
    "failed client connect",
)
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 5.0
PROBE_TIMEOUT = timedelta(seconds=5)
CONNECTED_ATTEMPT = 30.0
"""A call that failed after running this long was talking to Temporal until then (the SDK's
own retries give up within about 10 s): its failure starts a new outage."""


class TemporalUnreachable(StackflowError):
    """Temporal did not answer within ``--unavailable-timeout``: exit 1."""

    exit_code = 1


class TemporalRefused(StackflowError):
    """Temporal answered a call with an error the command does not handle: exit 1."""

    exit_code = 1


def settings() -> tuple[str, str, str]:
    """TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, STACKFLOW_TASK_QUEUE (with their defaults)."""
    return (
        os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
        os.environ.get("TEMPORAL_NAMESPACE", "default"),
        os.environ.get("STACKFLOW_TASK_QUEUE", TASK_QUEUE_DEFAULT),
    )


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Temporal could not be reached (rather than refused a call)."""
    if isinstance(exc, RPCError):
        return exc.status in UNREACHABLE_CODES or _transport(exc.message)
    if isinstance(exc, RuntimeError):  # Client.connect: "Failed client connect: …"
        return _transport(str(exc))
    return isinstance(exc, ConnectionError | TimeoutError)


def _transport(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in TRANSPORT_MARKERS)


def _reason(exc: BaseException) -> str:
    """A short reason: the gRPC message, or the innermost text of a connect error."""
    text = exc.message if isinstance(exc, RPCError) else str(exc)
    for marker in TRANSPORT_MARKERS[:-1]:
        if marker in text.lower():
            return marker
    return " ".join(text.split())[:200]


def cli_error(exc: BaseException) -> StackflowError | None:
    """The one-line error a Temporal connection/RPC error escaping a command becomes, or
    None for anything else (which then surfaces as it is)."""
    if isinstance(exc, StackflowError):
        return exc
    address, _, _ = settings()
    if is_unreachable(exc):
        return TemporalUnreachable(
            f"cannot reach Temporal at {address} ({_reason(exc)}); start it (`make up`) or "
            "set TEMPORAL_ADDRESS, and run the command again"
        )
    if isinstance(exc, RPCError):
        return TemporalRefused(
            f"Temporal at {address} refused the call ({exc.status.name if exc.status else '?'}: "
            f"{_reason(exc)})"
        )
    return None


_runtime: Runtime | None = None


def quiet_runtime() -> Runtime:
    """A Temporal runtime whose core logs only errors: the SDK's own retry warnings would
    otherwise print on stderr during an outage, around the CLI's one line."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")
                )
            )
        )
    return _runtime


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
        from stackflow.codec import data_converter

        async def connect() -> Client:
            if self._client is None:
                self._client = await Client.connect(
                    self.address,
                    namespace=self.namespace,
                    data_converter=data_converter(),
                    runtime=quiet_runtime(),
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
                f"Temporal at {self.address} is unreachable ({_reason(exc)}); retrying for "
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
            f"(--unavailable-timeout) during {what} ({_reason(exc)})"
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
