"""OpenTelemetry tracing (issue 24): with STACKFLOW_TRACING=otlp a real worker process and the
real CLI send the Temporal SDK's spans of an apply to an OTLP/HTTP collector (here a receiver
in the test decoding what it is sent): the CLI's start, the workflow and every activity the
run scheduled, in one trace; no span carries the spec's content. Off (the default), neither
the worker nor the CLI imports the tracing side of OpenTelemetry."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import workflow_id_for
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import (
    cli_json,
    expect_exit,
    file_resource,
    new_project,
    poll,
    write_spec,
)

MARKER = "sf-trace-marker-5b1e0c7d"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, str]


@dataclass
class Collector:
    """What an OTLP/HTTP collector was sent: the raw (decompressed) bodies and their spans."""

    url: str
    bodies: list[bytes] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


def _value(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def _attrs(pairs: Any) -> dict[str, str]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _strings(value: AnyValue) -> Iterator[str]:
    """Every string inside an attribute value (arrays and maps included)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        for item in value.array_value.values:
            yield from _strings(item)
    elif kind == "kvlist_value":
        for kv in value.kvlist_value.values:
            yield kv.key
            yield from _strings(kv.value)
    elif kind is not None:
        yield str(getattr(value, kind))


@pytest.fixture
def collector() -> Iterator[Collector]:
    """A stdlib HTTP server on a free port taking ``POST /v1/traces`` (OTLP protobuf)."""
    state: list[Collector] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            sink = state[0]
            with sink.lock:
                sink.bodies.append(body)
                for resource_spans in request.resource_spans:
                    service = _attrs(resource_spans.resource.attributes).get("service.name", "")
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            sink.spans.append(
                                Span(
                                    service=service,
                                    name=span.name,
                                    trace_id=span.trace_id.hex(),
                                    span_id=span.span_id.hex(),
                                    parent_id=span.parent_span_id.hex(),
                                    attributes=_attrs(span.attributes),
                                )
                            )
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.append(Collector(url=f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state[0]
    finally:
        server.shutdown()
        server.server_close()


def traced_env(env: dict[str, str], collector: Collector) -> dict[str, str]:
    traced = dict(env)
    traced.update(
        {
            "STACKFLOW_TRACING": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            # nothing is sent before the process flushes on its way out (or the batch fills):
            # the worker's spans arrive only if it flushes when stopped, the CLI's at its exit
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
        }
    )
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED"):
        traced.pop(name, None)
    return traced


async def _logged(worker: WorkerProcess, line: str) -> bool:
    return line in worker.log.read_text()


async def test_an_apply_is_one_trace_from_the_cli_through_the_worker(
    tmp_path: Path, stack_env: dict[str, str], collector: Collector, temporal_client: Client
) -> None:
    env = traced_env(stack_env, collector)
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        await poll(
            lambda: _logged(worker, f"stackflow worker tracing: OTLP to {collector.url}/v1/traces"),
            timeout=5,
            what="the worker's tracing line",
        )
        project = new_project()
        root = tmp_path / "site"
        root.mkdir()
        files = [
            file_resource(root / "a.conf", f"password={MARKER}\n"),
            file_resource(root / "b.conf", f"{MARKER}-b\n"),
        ]
        spec = write_spec(tmp_path / "apply.yaml", files)
        applied = cli_json(
            expect_exit(
                run_cli(env, "apply", "-f", str(spec), "--yes", "--project", project, "-o", "json")
            )
        )
        assert sorted(r["status"] for r in applied["results"]) == ["succeeded"] * 2
        assert (root / "a.conf").read_text() == f"password={MARKER}\n"

        # the CLI flushed its spans as it exited; the worker has sent nothing yet
        cli_spans = collector.received()
        assert {s.service for s in cli_spans} == {"stackflow-cli"}, cli_spans
    finally:
        worker.stop()  # SIGTERM: the worker flushes what it buffered on its way out
    assert "stackflow worker stopping" in worker.log.read_text()

    workflow_id = workflow_id_for(StackRef(project, "default"))
    handle = temporal_client.get_workflow_handle(workflow_id)
    run_id = (await handle.describe()).run_id
    scheduled: set[tuple[str, str]] = set()
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            scheduled.add((attrs.activity_type.name, attrs.activity_id))
        marker = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and (
            marker.marker_name == "core_local_activity"
        ):  # a local activity (the phase writes): its type and id in the marker's data
            data = json.loads(marker.details["data"].payloads[0].data)
            scheduled.add((data["activity_type"], data["activity_id"]))
    kinds = {kind for kind, _ in scheduled}
    assert "run_group" in kinds, scheduled  # the files' group
    assert "set_phase" in kinds, scheduled  # local activities are traced too

    spans = collector.received()
    [start] = [
        s
        for s in spans
        if s.name == "StartWorkflow:ApplyWorkflow"
        and s.attributes.get("temporalWorkflowID") == workflow_id
    ]
    assert start.service == "stackflow-cli" and start.parent_id == ""
    trace = start.trace_id

    run = [s for s in spans if s.attributes.get("temporalRunID") == run_id]
    names = {s.name for s in run}
    assert {"RunWorkflow:ApplyWorkflow", "CompleteWorkflow:ApplyWorkflow"} <= names, names
    [workflow_span] = [s for s in run if s.name == "RunWorkflow:ApplyWorkflow"]
    assert workflow_span.service == "stackflow-worker"
    assert workflow_span.parent_id == start.span_id

    # every activity the run scheduled ran under a span of this run, in the CLI's trace
    ran = {
        (s.name.removeprefix("RunActivity:"), s.attributes["temporalActivityID"])
        for s in run
        if s.name.startswith("RunActivity:")
    }
    assert ran == scheduled
    started = {s.span_id for s in run if s.name.startswith("StartActivity:")}
    for s in run:
        if s.name.startswith("RunActivity:"):
            assert s.parent_id in started, s
            assert s.attributes["temporalWorkflowID"] == workflow_id
    # queries answer in their own traces (the CLI asks without a span of the run open)
    in_run = [s for s in run if not s.name.startswith("HandleQuery:")]
    assert {s.trace_id for s in in_run} == {trace}, sorted((s.name, s.trace_id) for s in in_run)

    # ids and names only: no attribute (nor anything else sent) holds the spec's content
    assert collector.bodies
    for body in collector.bodies:
        assert MARKER.encode() not in body
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            values = [v for kv in resource_spans.resource.attributes for v in _strings(kv.value)]
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    values += [v for kv in span.attributes for v in _strings(kv.value)]
                    for span_event in span.events:
                        values += [v for kv in span_event.attributes for v in _strings(kv.value)]
                    values += [span.name, span.status.message]
            assert not [v for v in values if MARKER in v or str(root) in v]
    keys = {key for s in spans for key in s.attributes}
    assert keys <= {
        "temporalWorkflowID",
        "temporalRunID",
        "temporalActivityID",
        "temporalActivityType",
        "temporalUpdateID",
    }, keys


TRACING_PARTS = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "temporalio.contrib.opentelemetry",
)

OFF_PROBE = """
import json, sys
import stackflow.worker.main as worker
from stackflow.temporal import tracing
before = set(sys.modules)
found = tracing.interceptors(tracing.WORKER)
new = sorted(m for m in set(sys.modules) - before if "opentelemetry" in m)
print(json.dumps({"interceptors": len(found), "new": new, "modules": sorted(sys.modules)}))
"""

CLI_PROBE = """
import json, sys
import stackflow.cli.main
import stackflow.api.local  # what the CLI connects with (FastAPI imports OTel's API itself)
from stackflow.temporal import tracing
before = set(sys.modules)
assert tracing.interceptors(tracing.CLI) == []
new = sorted(m for m in set(sys.modules) - before if "opentelemetry" in m)
print(json.dumps({"new": new, "modules": sorted(sys.modules)}))
"""


def _probe(code: str, env: dict[str, str]) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "settings",
    [{}, {"STACKFLOW_TRACING": "none"}, {"STACKFLOW_TRACING": "otlp", "OTEL_SDK_DISABLED": "true"}],
)
def test_tracing_off_imports_nothing_of_it(
    stack_env: dict[str, str], settings: dict[str, str]
) -> None:
    env = {k: v for k, v in stack_env.items() if k != "STACKFLOW_TRACING"}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9/"  # an endpoint alone: still off
    env.update(settings)
    worker = _probe(OFF_PROBE, env)
    assert worker["interceptors"] == 0
    # building the worker's interceptor list imported nothing of OpenTelemetry, and nothing of
    # its tracing is loaded (redis-py imports OpenTelemetry's metrics API on its own)
    assert worker["new"] == []
    assert not [m for m in worker["modules"] if m.startswith(TRACING_PARTS)]
    # the CLI's tracing imports nothing of OpenTelemetry, and none of its tracing is loaded
    # (FastAPI, the API in the CLI's process, imports OpenTelemetry's API on its own)
    cli = _probe(CLI_PROBE, env)
    assert cli["new"] == []
    assert not [m for m in cli["modules"] if m.startswith(TRACING_PARTS)]


def test_a_bad_tracing_mode_stops_the_worker_with_one_line(stack_env: dict[str, str]) -> None:
    env = dict(stack_env)
    env["STACKFLOW_TRACING"] = "jaeger"
    proc = run_cli(env, "worker", timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "STACKFLOW_TRACING='jaeger': expected otlp" in last, proc.stderr
    assert "Traceback" not in proc.stderr
