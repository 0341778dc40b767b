"""What every Temporal client of stackflow shares (the worker, the CLI, ``stackflow serve``,
other services): the connection settings (address, namespace, TLS, mTLS and API key: see
:mod:`stackflow.temporal.tls`) and the one way to connect with them (:func:`connect`), the
errors a connection can end in and how a Temporal error is classified (unreachable: wait and
retry; refused, a TLS handshake included: one line), a quiet SDK runtime, and the memo key
that makes a start safe to retry. The CLI rides out an outage through the API, which answers
503 while Temporal cannot be reached (``StackflowClient.patience``)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence

from temporalio.client import Client, Interceptor
from temporalio.converter import DataConverter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.errors import StackflowError
from stackflow.temporal.operation import TASK_QUEUE_DEFAULT
from stackflow.temporal.tls import TemporalTLS

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


async def connect(
    data_converter: DataConverter,
    *,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
    address: str | None = None,
    namespace: str | None = None,
) -> Client:
    """A client of the Temporal the environment names (``settings``), over TLS, mTLS and/or
    with an API key as ``TEMPORAL_TLS*`` / ``TEMPORAL_API_KEY`` say (:class:`TemporalTLS`:
    bad settings raise its one-line ``TemporalSettingsError`` before any connection)."""
    default_address, default_namespace, _ = settings()
    secure = TemporalTLS.from_env()
    target = address or default_address
    try:
        return await Client.connect(
            target,
            namespace=namespace or default_namespace,
            data_converter=data_converter,
            runtime=runtime,
            interceptors=interceptors,
            tls=secure.tls_config(),
            api_key=secure.api_key,
        )
    except RuntimeError as exc:
        if not closed_on_open(exc):
            raise
        # the server closed the connection as it opened: ask it why, with one handshake
        why = await asyncio.to_thread(secure.diagnose, target)
        if why is None:
            raise
        if not secure.enabled:
            plain = f"Temporal at {target} refused a plaintext connection: {why}"
            raise TemporalRefused(plain) from None
        raise TemporalRefused(tls_refusal(target, why, secure)) from None


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Temporal could not be reached (rather than refused a call). A TLS
    handshake Temporal refused (no or an unknown client certificate, a server certificate
    this client does not trust, TLS on one side only) is a refusal: waiting does not help."""
    if is_tls_refusal(exc):
        return False
    if isinstance(exc, RPCError):
        return exc.status in UNREACHABLE_CODES or _transport(exc.message)
    if isinstance(exc, RuntimeError):  # Client.connect: "Failed client connect: …"
        return _transport(str(exc))
    return isinstance(exc, ConnectionError | TimeoutError)


def _transport(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in TRANSPORT_MARKERS)


TLS_MARKERS = (
    "fatal alert",
    "certificate",
    "handshake",
    "invalid peer",
    "unknownissuer",
    "invalidmessage",
    "invalidcontenttype",
    "corrupt message",
    "wrong version number",
)
"""Words of the errors of a TLS handshake that failed (a server's alert, a certificate this
client does not trust, TLS spoken to a plaintext port), as the SDK's core (rustls) reports
them."""


def is_tls_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is a TLS handshake that failed (see ``TLS_MARKERS``)."""
    if isinstance(exc, RPCError):
        text = exc.message
    elif isinstance(exc, RuntimeError):
        text = str(exc)
    else:
        return False
    text = text.lower()
    return any(marker in text for marker in TLS_MARKERS)


CLOSED_ON_OPEN = "call error after connection"
CLOSED_HOW = ("connection closed", "broken pipe", "connection reset")
"""A connection the server closed as soon as it was opened: what a plaintext client of a TLS
port sees, or a TLS 1.3 client whose certificate the server refuses on its first call (and,
rarely, a proxy whose backend is down: so it stays an outage, waited out)."""


def closed_on_open(exc: BaseException) -> bool:
    """The connection was closed as soon as it opened (``CLOSED_ON_OPEN``)."""
    text = (exc.message if isinstance(exc, RPCError) else str(exc)).lower()
    return CLOSED_ON_OPEN in text and any(how in text for how in CLOSED_HOW)


def reason(exc: BaseException) -> str:
    """A short reason: the gRPC message, or the innermost text of a connect error."""
    text = exc.message if isinstance(exc, RPCError) else str(exc)
    if closed_on_open(exc) and not TemporalTLS.enabled_in_env():
        return (
            "it closed the connection as soon as it opened; if it requires TLS, set "
            "TEMPORAL_TLS=true (and TEMPORAL_TLS_CLIENT_CERT_PATH/_KEY_PATH for mTLS)"
        )
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
    if is_tls_refusal(exc):
        return TemporalRefused(tls_refusal(address, tls_reason(exc)))
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


TLS_REASONS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"received fatal alert: \w+",
        r"invalid peer certificate: [\w()]+",
        r"Invalid\w*\(\w+\)",
        r"[^:()]*(?:tls|ssl|handshake|certificate)[^:()]*",
    )
)


def tls_refusal(address: str, why: str, secure: TemporalTLS | None = None) -> str:
    """The line of a TLS connection Temporal refused (or that failed), ``why`` its reason."""
    how = secure.describe() if secure is not None else TemporalTLS.describe_env()
    return (
        f"Temporal at {address} refused the TLS connection ({why}); this client connects "
        f"with {how}: set TEMPORAL_TLS_* (client certificate and key, server CA, server "
        "name) or TEMPORAL_API_KEY as the server requires"
    )


def tls_reason(exc: BaseException) -> str:
    """What the TLS error says, without the SDK's nesting (``received fatal alert:
    CertificateRequired``, ``InvalidCertificate(UnknownIssuer)``), at most 200 characters."""
    text = exc.message if isinstance(exc, RPCError) else str(exc)
    for pattern in TLS_REASONS:
        found = pattern.search(text)
        if found:
            text = found.group(0)
            break
    return " ".join(text.split())[:200]


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
