"""What every Temporal client of stackflow shares (the CLI, ``stackflow serve``, other
services): the connection settings, the errors a connection can end in and how a Temporal
error is classified (unreachable: wait and retry; refused: one line), a quiet SDK runtime,
and the memo key that makes a start safe to retry. The CLI's own riding-out of outages is
:mod:`stackflow.cli.connection`."""

from __future__ import annotations

import os

from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode

from stackflow.errors import StackflowError
from stackflow.operation import TASK_QUEUE_DEFAULT

START_TOKEN = "stackflow-start"
"""Memo key of the token a start puts on its run (recognises a retried start's run)."""
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


def reason(exc: BaseException) -> str:
    """A short reason: the gRPC message, or the innermost text of a connect error."""
    text = exc.message if isinstance(exc, RPCError) else str(exc)
    for marker in TRANSPORT_MARKERS[:-1]:
        if marker in text.lower():
            return marker
    return " ".join(text.split())[:200]


def connection_error(exc: BaseException) -> StackflowError | None:
    """The one-line error a Temporal connection/RPC error escaping a command or a request
    becomes, or None for anything else (which then surfaces as it is)."""
    if isinstance(exc, StackflowError):
        return exc
    address, _, _ = settings()
    if is_unreachable(exc):
        return TemporalUnreachable(
            f"cannot reach Temporal at {address} ({reason(exc)}); start it (`make up`) or "
            "set TEMPORAL_ADDRESS, and run the command again"
        )
    if isinstance(exc, RPCError):
        return TemporalRefused(
            f"Temporal at {address} refused the call ({exc.status.name if exc.status else '?'}: "
            f"{reason(exc)})"
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
