"""``GET /metrics``: the API's own counters in Prometheus' text format (0.0.4), kept in the
process (each replica is scraped on its own), and the Temporal SDK's metrics of the API's
client (``temporal_request``, ``temporal_request_latency``, …: the SDK records them in a
:class:`~temporalio.runtime.MetricBuffer`, drained after each request and on each scrape).
Labels name route templates and RPC names, never a project, workspace or run id, so the
endpoint needs no token and leaks no names. Every label a request decides is bounded: its
method is one of :data:`METHODS` or ``other``, its route a template of the app (or ``(no
route)``), its status a three-digit code (else ``other``), so no caller can grow the
endpoint by sending made-up methods or paths."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BUFFERED_METRIC_KIND_HISTOGRAM,
    BufferedMetricKind,
    LoggingConfig,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SDK_BUFFER = 20_000
"""SDK metric updates held between drains (each Temporal call makes two or three)."""

Labels = tuple[tuple[str, str], ...]

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The methods labelled by name (what the API and its probes use); any other is ``other``."""
OTHER = "other"


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER


def status_label(status: int) -> str:
    return str(status) if 100 <= status <= 599 else OTHER


def sdk_runtime() -> tuple[Runtime, MetricBuffer]:
    """The API's Temporal runtime (core logs errors only, as the CLI's) recording the SDK's
    metrics in a buffer this endpoint drains, durations in seconds."""
    buffer = MetricBuffer(SDK_BUFFER, MetricBufferDurationFormat.SECONDS)
    runtime = Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")),
            metrics=buffer,
            attach_service_name=False,
        )
    )
    return runtime, buffer


def _labels(**values: str) -> str:
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in values.items()
    )
    return "{" + inner + "}"


class SdkMetrics:
    """The SDK's buffered updates, folded: counters summed, gauges' last value, histograms
    over :data:`BUCKETS`."""

    def __init__(self, buffer: MetricBuffer) -> None:
        self.buffer = buffer
        self.help: dict[str, tuple[BufferedMetricKind, str]] = {}
        self.counters: dict[tuple[str, Labels], float] = defaultdict(float)
        self.gauges: dict[tuple[str, Labels], float] = {}
        self.histograms: dict[tuple[str, Labels], list[float]] = {}
        """Per series: the bucket counts, then the sum and the count."""

    def drain(self) -> None:
        for update in self.buffer.retrieve_updates():
            metric = update.metric
            kind, name = metric.kind, metric.name
            self.help.setdefault(name, (kind, metric.description or name))
            key = (name, _sorted(update.attributes))
            value = float(update.value)
            if kind == BUFFERED_METRIC_KIND_COUNTER:
                self.counters[key] += value
            elif kind == BUFFERED_METRIC_KIND_GAUGE:
                self.gauges[key] = value
            elif kind == BUFFERED_METRIC_KIND_HISTOGRAM:
                series = self.histograms.setdefault(key, [0.0] * (len(BUCKETS) + 2))
                for i in range(bisect.bisect_left(BUCKETS, value), len(BUCKETS)):
                    series[i] += 1
                series[-2] += value
                series[-1] += 1

    def render(self) -> list[str]:
        lines: list[str] = []
        types = {
            BUFFERED_METRIC_KIND_COUNTER: "counter",
            BUFFERED_METRIC_KIND_GAUGE: "gauge",
            BUFFERED_METRIC_KIND_HISTOGRAM: "histogram",
        }
        for name, (kind, description) in sorted(self.help.items()):
            lines += [
                f"# HELP {name} {' '.join(description.split())}",
                f"# TYPE {name} {types[kind]}",
            ]
            for (series, labels), value in sorted({**self.counters, **self.gauges}.items()):
                if series == name:
                    lines.append(f"{name}{_labels(**dict(labels))} {value:g}")
            for (series, labels), counts in sorted(self.histograms.items()):
                if series != name:
                    continue
                by = dict(labels)
                for bound, n in zip(BUCKETS, counts, strict=False):
                    lines.append(f"{name}_bucket{_labels(**by, le=f'{bound:g}')} {n:g}")
                lines.append(f"{name}_bucket{_labels(**by, le='+Inf')} {counts[-1]:g}")
                lines.append(f"{name}_sum{_labels(**by)} {counts[-2]:.6f}")
                lines.append(f"{name}_count{_labels(**by)} {counts[-1]:g}")
        return lines


def _sorted(attributes: Mapping[str, object]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in attributes.items()))


class Metrics:
    def __init__(self, sdk: MetricBuffer | None = None) -> None:
        self._lock = threading.Lock()
        self._sdk = SdkMetrics(sdk) if sdk is not None else None
        self._requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = defaultdict(float)
        self._counts: dict[tuple[str, str], int] = defaultdict(int)
        self._starts: dict[tuple[str, str], int] = defaultdict(int)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request; ``route`` is the matched route's template (never the raw
        path), ``method`` and ``status`` are bounded here."""
        method = method_label(method)
        with self._lock:
            self._requests[(method, route, status_label(status))] += 1
            key = (method, route)
            buckets = self._buckets.setdefault(key, [0] * len(BUCKETS))
            at = bisect.bisect_left(BUCKETS, seconds)
            for i in range(at, len(BUCKETS)):
                buckets[i] += 1
            self._sums[key] += seconds
            self._counts[key] += 1
            if self._sdk is not None:
                self._sdk.drain()

    def run_started(self, operation: str, created: bool) -> None:
        with self._lock:
            self._starts[(operation, "new" if created else "idempotent")] += 1

    def run_refused(self, operation: str) -> None:
        """A start that failed: invalid, a busy stack, Temporal or the backend unreachable."""
        with self._lock:
            self._starts[(operation, "refused")] += 1

    def render(self) -> str:
        lines = [
            "# HELP stackflow_api_requests_total HTTP requests answered, by route and status.",
            "# TYPE stackflow_api_requests_total counter",
        ]
        with self._lock:
            for (method, route, status), n in sorted(self._requests.items()):
                lines.append(
                    "stackflow_api_requests_total"
                    + _labels(method=method, route=route, status=status)
                    + f" {n}"
                )
            lines += [
                "# HELP stackflow_api_request_seconds Time to answer, by route.",
                "# TYPE stackflow_api_request_seconds histogram",
            ]
            for (method, route), buckets in sorted(self._buckets.items()):
                for bound, n in zip(BUCKETS, buckets, strict=True):
                    lines.append(
                        "stackflow_api_request_seconds_bucket"
                        + _labels(method=method, route=route, le=f"{bound:g}")
                        + f" {n}"
                    )
                count = self._counts[(method, route)]
                lines.append(
                    "stackflow_api_request_seconds_bucket"
                    + _labels(method=method, route=route, le="+Inf")
                    + f" {count}"
                )
                lines.append(
                    "stackflow_api_request_seconds_sum"
                    + _labels(method=method, route=route)
                    + f" {self._sums[(method, route)]:.6f}"
                )
                lines.append(
                    "stackflow_api_request_seconds_count"
                    + _labels(method=method, route=route)
                    + f" {count}"
                )
            lines += [
                "# HELP stackflow_api_runs_started_total Runs started (new), found by their "
                "Idempotency-Key (idempotent) or refused, by operation.",
                "# TYPE stackflow_api_runs_started_total counter",
            ]
            for (operation, kind), n in sorted(self._starts.items()):
                lines.append(
                    "stackflow_api_runs_started_total"
                    + _labels(operation=operation, kind=kind)
                    + f" {n}"
                )
            if self._sdk is not None:
                self._sdk.drain()
                lines += self._sdk.render()
        return "\n".join(lines) + "\n"
