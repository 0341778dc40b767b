"""stackflow's metrics (:mod:`stackflow.temporal.metrics`) and the API's fold of the SDK's buffered
metrics (:mod:`stackflow.api.metrics`): labels stay in their known sets, the worker's
endpoint serves stackflow's metrics beside the SDK's, a bad address is one line."""

from __future__ import annotations

import dataclasses
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from temporalio.runtime import MetricBuffer, MetricBufferDurationFormat, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from stackflow.api.metrics import Metrics, sdk_runtime
from stackflow.core.errors import StackflowError
from stackflow.model.events import EventType, NewEvent, run_complete
from stackflow.model.release import Operation
from stackflow.temporal import metrics


@pytest.fixture
def buffered() -> Iterator[tuple[metrics.StackflowMetrics, MetricBuffer]]:
    buffer = MetricBuffer(1000, MetricBufferDurationFormat.SECONDS)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer, attach_service_name=False))
    yield metrics.StackflowMetrics(runtime.metric_meter, ["OnPrem", "Kubernetes"]), buffer


def counted(buffer: MetricBuffer) -> Counter[tuple[str, tuple[tuple[str, Any], ...]]]:
    """Counter updates by (name, sorted labels), summed; histograms by their count."""
    out: Counter[tuple[str, tuple[tuple[str, Any], ...]]] = Counter()
    for update in buffer.retrieve_updates():
        labels = tuple(sorted(update.attributes.items()))
        out[(update.metric.name, labels)] += 1 if update.metric.kind == 2 else int(update.value)
    return out


def in_activity(activity_type: str, workflow_type: str = "ApplyWorkflow") -> ActivityEnvironment:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, activity_type=activity_type, workflow_type=workflow_type
    )
    return environment


def test_runs_are_counted_by_operation_and_outcome_from_run_complete_events_only(
    buffered: tuple[metrics.StackflowMetrics, MetricBuffer],
) -> None:
    m, buffer = buffered
    phase = NewEvent(type=EventType.phase, key="phase/applying", data={"phase": "applying"})
    m.runs_completed(Operation.apply, [phase])
    m.runs_completed(Operation.apply, [phase, run_complete("succeeded", revision=1)])
    m.runs_completed(Operation.destroy, [run_complete("failed", revision=2, error="x")])
    m.runs_completed(Operation.apply, [run_complete("weird")])
    # a preview's end comes through append_events: the workflow type names the operation
    preview = in_activity("append_events", "PreviewWorkflow")
    preview.run(lambda: m.runs_completed(None, [run_complete("succeeded")]))
    assert counted(buffer) == {
        ("stackflow_runs_total", (("operation", "apply"), ("outcome", "succeeded"))): 1,
        ("stackflow_runs_total", (("operation", "destroy"), ("outcome", "failed"))): 1,
        ("stackflow_runs_total", (("operation", "apply"), ("outcome", "other"))): 1,
        ("stackflow_runs_total", (("operation", "preview"), ("outcome", "succeeded"))): 1,
    }


def test_resource_labels_stay_in_their_known_sets(
    buffered: tuple[metrics.StackflowMetrics, MetricBuffer],
) -> None:
    m, buffer = buffered
    group = in_activity("run_group")
    group.run(lambda: m.resource_done("OnPrem", "Create", "succeeded", 0.2))
    group.run(lambda: m.resource_done("OnPrem", "Create", "succeeded", 0.3))
    in_activity("delete_resource").run(
        lambda: m.resource_done("Kubernetes", "Delete", "succeeded", 1.0)
    )
    # a spec's unregistered type, a failure before the type was known, outside an activity
    group.run(lambda: m.resource_done("my-cloud/Thing", "Update", "failed"))
    group.run(lambda: m.resource_done(None, "Bogus", "failed"))
    m.resource_done("OnPrem", "Create", "failed")

    def key(runtime: str, action: str, step: str, outcome: str) -> Any:
        labels = {"runtime": runtime, "action": action, "step": step, "outcome": outcome}
        return ("stackflow_resources_total", tuple(sorted(labels.items())))

    def seconds(runtime: str, action: str) -> Any:
        return ("stackflow_resource_seconds", (("action", action), ("runtime", runtime)))

    assert counted(buffer) == {
        key("OnPrem", "Create", "run_group", "succeeded"): 2,
        seconds("OnPrem", "Create"): 2,
        key("Kubernetes", "Delete", "delete_resource", "succeeded"): 1,
        seconds("Kubernetes", "Delete"): 1,
        key("other", "Update", "run_group", "failed"): 1,
        key("unknown", "other", "run_group", "failed"): 1,
        key("OnPrem", "Create", "unknown", "failed"): 1,
    }


def test_lock_policy_and_notification_counters(
    buffered: tuple[metrics.StackflowMetrics, MetricBuffer],
) -> None:
    m, buffer = buffered
    m.lock("acquired")
    m.lock("acquired")
    m.lock("recovered")
    m.policy("deny", 2)
    m.policy("error", 1)
    m.policy("pass", 0)  # asked only for the policy input: no gate, not counted
    m.policy("maybe", 1)
    m.notification_attempt("delivered")
    m.notification_attempt("unavailable")
    m.notification_undelivered("dead_lettered")
    assert counted(buffer) == {
        ("stackflow_stack_lock_total", (("outcome", "acquired"),)): 2,
        ("stackflow_stack_lock_total", (("outcome", "recovered"),)): 1,
        ("stackflow_policy_decisions_total", (("outcome", "deny"),)): 1,
        ("stackflow_policy_decisions_total", (("outcome", "error"),)): 1,
        ("stackflow_policy_decisions_total", (("outcome", "other"),)): 1,
        ("stackflow_notification_attempts_total", (("outcome", "delivered"),)): 1,
        ("stackflow_notification_attempts_total", (("outcome", "unavailable"),)): 1,
        ("stackflow_notifications_undelivered_total", (("reason", "dead_lettered"),)): 1,
    }


def test_the_default_meter_records_nothing_and_install_replaces_it() -> None:
    before = metrics.current()
    before.run_ended("apply", "succeeded")  # a no-op meter: nothing to see, nothing raised
    buffer = MetricBuffer(100)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    try:
        installed = metrics.install(runtime.metric_meter, ["OnPrem"])
        assert metrics.current() is installed and installed.runtimes == {"OnPrem"}
        metrics.current().lock("fenced")
        assert [u.metric.name for u in buffer.retrieve_updates()] == ["stackflow_stack_lock_total"]
    finally:
        metrics._current = before


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("127.0.0.1:9464", "127.0.0.1:9464"),
        (" 0.0.0.0:1 ", "0.0.0.0:1"),
        (":9464", "0.0.0.0:9464"),
        ("[::1]:9464", "[::1]:9464"),
    ],
)
def test_bind_address(text: str, bound: str) -> None:
    assert metrics.bind_address(text) == bound


def test_bind_address_resolves_a_name() -> None:
    assert metrics.bind_address("localhost:9464") in ("127.0.0.1:9464", "[::1]:9464")


@pytest.mark.parametrize("text", ["9464", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "h:x"])
def test_a_bad_bind_address_is_one_line(text: str) -> None:
    with pytest.raises(StackflowError, match=r"STACKFLOW_METRICS_ADDRESS=.*HOST:PORT"):
        metrics.bind_address(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_worker_runtime_serves_stackflow_metrics_beside_the_sdk_ones() -> None:
    port = free_port()
    runtime = metrics.prometheus_runtime(f"127.0.0.1:{port}")
    m = metrics.StackflowMetrics(runtime.metric_meter, ["OnPrem"])
    m.run_ended("apply", "succeeded")
    m.resource_done("OnPrem", "Create", "succeeded", 0.07)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'stackflow_runs_total{operation="apply",outcome="succeeded"} 1' in text
    assert "service_name" not in text
    # the resource histogram has stackflow's buckets, in seconds
    assert 'stackflow_resource_seconds_bucket{action="Create",runtime="OnPrem",le="0.05"} 0' in text
    assert 'stackflow_resource_seconds_bucket{action="Create",runtime="OnPrem",le="0.1"} 1' in text
    assert 'le="600"' in text

    with pytest.raises(StackflowError, match=r"STACKFLOW_METRICS_ADDRESS=.*in use"):
        metrics.prometheus_runtime(f"127.0.0.1:{port}")


def test_the_api_folds_the_sdk_buffer_into_its_own_endpoint() -> None:
    runtime, buffer = sdk_runtime()
    meter = runtime.metric_meter  # the SDK's client metrics arrive in the same buffer
    requests = meter.create_counter("temporal_request", "Count of client request successes")
    latency = meter.create_histogram_float("temporal_request_latency", "Latencies", "s")
    requests.add(2, {"operation": "StartWorkflowExecution"})
    latency.record(0.02, {"operation": "StartWorkflowExecution"})
    latency.record(3.0, {"operation": "StartWorkflowExecution"})
    api = Metrics(buffer)
    api.run_started("apply", True)
    api.run_refused("apply")
    api.request("GET", "/healthz", 200, 0.001)  # drains the buffer too
    requests.add(1, {"operation": "StartWorkflowExecution"})
    text = api.render()
    op = 'operation="StartWorkflowExecution"'
    assert 'stackflow_api_runs_started_total{operation="apply",kind="new"} 1' in text
    assert 'stackflow_api_runs_started_total{operation="apply",kind="refused"} 1' in text
    assert "# TYPE temporal_request counter" in text
    assert f"temporal_request{{{op}}} 3" in text
    assert "# TYPE temporal_request_latency histogram" in text
    assert f'temporal_request_latency_bucket{{{op},le="0.025"}} 1' in text
    assert f'temporal_request_latency_bucket{{{op},le="2.5"}} 1' in text
    assert f'temporal_request_latency_bucket{{{op},le="+Inf"}} 2' in text
    assert f"temporal_request_latency_count{{{op}}} 2" in text
    assert f"temporal_request_latency_sum{{{op}}} 3.020000" in text
    # without a buffer (tests, create_app's default) only the API's own lines
    assert "temporal_" not in Metrics().render()
