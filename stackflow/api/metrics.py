"""``GET /metrics``: the API's own counters in Prometheus' text format (0.0.4), kept in the
process (each replica is scraped on its own). Labels name route templates, never a project,
workspace or run id, so the endpoint needs no token and leaks no names."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _labels(**values: str) -> str:
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in values.items()
    )
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = defaultdict(float)
        self._counts: dict[tuple[str, str], int] = defaultdict(int)
        self._starts: dict[tuple[str, str], int] = defaultdict(int)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(method, route, str(status))] += 1
            key = (method, route)
            buckets = self._buckets.setdefault(key, [0] * len(BUCKETS))
            at = bisect.bisect_left(BUCKETS, seconds)
            for i in range(at, len(BUCKETS)):
                buckets[i] += 1
            self._sums[key] += seconds
            self._counts[key] += 1

    def run_started(self, operation: str, created: bool) -> None:
        with self._lock:
            self._starts[(operation, "new" if created else "idempotent")] += 1

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
                "# HELP stackflow_api_runs_started_total Runs started (new) or found by their "
                "Idempotency-Key (idempotent), by operation.",
                "# TYPE stackflow_api_runs_started_total counter",
            ]
            for (operation, kind), n in sorted(self._starts.items()):
                lines.append(
                    "stackflow_api_runs_started_total"
                    + _labels(operation=operation, kind=kind)
                    + f" {n}"
                )
        return "\n".join(lines) + "\n"
