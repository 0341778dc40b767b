"""Optional OpenTelemetry tracing of runs, off by default: ``STACKFLOW_TRACING=otlp`` gives
the worker's, the API's and the CLI's Temporal clients the Temporal SDK's
``TracingInterceptor`` (the worker's client passes it on to its workers), whose spans a
``BatchSpanProcessor`` sends to an OTLP/HTTP collector.

Only ``STACKFLOW_TRACING=otlp`` turns it on: an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` alone does not
(a platform may set those for every container), and ``OTEL_SDK_DISABLED=true`` turns it off
again. Everything else is the standard OpenTelemetry environment: where to send
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``,
else ``http://localhost:4318/v1/traces``), ``OTEL_EXPORTER_OTLP_HEADERS``, ``_TIMEOUT``,
``_COMPRESSION``, ``_CERTIFICATE``, the batch processor's ``OTEL_BSP_*``, and the resource's
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``; unnamed there, the service is
``stackflow-worker``, ``stackflow-api`` or ``stackflow-cli``.

What a span carries is the interceptor's: its name (``StartWorkflow:ApplyWorkflow``,
``RunWorkflow:ApplyWorkflow``, ``StartActivity:run_group``, ``RunActivity:run_group``, ...)
and the ids of its workflow, run and activity; never a payload (a spec, a resource's
attributes or state). stackflow adds no attribute of its own.

Off, nothing here imports OpenTelemetry: the CLI starts as fast as without it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from stackflow.core.errors import StackflowError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.client import Interceptor

MODE_ENV = "STACKFLOW_TRACING"
MODES = ("otlp", "none")
WORKER = "stackflow-worker"
API = "stackflow-api"
CLI = "stackflow-cli"
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"

_lock = threading.Lock()
_provider: TracerProvider | None = None
_interceptor: Interceptor | None = None


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``STACKFLOW_TRACING`` asks for OTLP tracing (and ``OTEL_SDK_DISABLED`` does not
    say no); another value is one line of error (``otlp``, or unset / empty / ``none``)."""
    env = os.environ if environ is None else environ
    mode = env.get(MODE_ENV, "").strip().lower()
    if mode not in ("", *MODES):
        raise StackflowError(
            f"{MODE_ENV}={env.get(MODE_ENV)!r}: expected otlp (send traces to the OTLP/HTTP "
            "collector OTEL_EXPORTER_OTLP_ENDPOINT names) or none (the default)"
        )
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return mode == "otlp" and not disabled


def endpoint(environ: Mapping[str, str] | None = None) -> str:
    """Where the spans go, as the exporter resolves it, without any user:password part."""
    env = os.environ if environ is None else environ
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not url:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        url = f"{base.removesuffix('/')}/v1/traces" if base else DEFAULT_ENDPOINT
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def interceptors(service: str) -> list[Interceptor]:
    """The Temporal client interceptors of this process: none when tracing is off (nothing of
    OpenTelemetry imported), else the ``TracingInterceptor`` on the process's one tracer
    provider, made on first use with ``service`` as its service name (unless
    ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one)."""
    global _provider, _interceptor
    if not enabled():
        return []
    with _lock:
        if _interceptor is None:
            _provider = _tracer_provider(service)
            _interceptor = _tracing_interceptor(_provider)
        return [_interceptor]


def _tracer_provider(service: str) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = OTELResourceDetector().detect().attributes.get(SERVICE_NAME)
    resource = Resource.create({} if named else {SERVICE_NAME: service})
    # shutdown_on_exit: a CLI command's spans are flushed when it exits
    provider = TracerProvider(resource=resource, shutdown_on_exit=True)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def _tracing_interceptor(provider: TracerProvider) -> Interceptor:
    from temporalio.contrib.opentelemetry import TracingInterceptor

    # always_create_workflow_spans: a run started by a client without tracing (a schedule,
    # a CLI with tracing off) still gets its workflow's spans, if not one trace for all
    return TracingInterceptor(provider.get_tracer("stackflow"), always_create_workflow_spans=True)


def shutdown() -> None:
    """Send what is still buffered and stop the provider (the worker, on its way out);
    nothing when tracing never started in this process."""
    global _provider, _interceptor
    with _lock:
        provider, _provider, _interceptor = _provider, None, None
    if provider is not None:
        provider.shutdown()
