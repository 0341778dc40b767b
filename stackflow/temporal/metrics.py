"""stackflow's own Prometheus metrics, recorded on the Temporal SDK runtime's meter, so one
endpoint per worker serves them beside the SDK's (``temporal_*``): ``STACKFLOW_METRICS_ADDRESS``
(``stackflow worker --metrics-address``) makes the worker's runtime export both at
``http://ADDRESS/metrics``. Unset, every helper here records on a no-op meter.

Labels are bounded by construction: an operation, an outcome, a runtime the worker has
registered, a resource action, the activity that recorded it. Never a project, workspace,
run or resource id; a value outside the known set is recorded as ``other``.

Activities record with one call each: ``metrics.current().run_ended(...)`` and friends.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Literal

from temporalio import activity
from temporalio.common import MetricCounter, MetricHistogramFloat, MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from stackflow.core.errors import StackflowError
from stackflow.engine.diff import Action
from stackflow.model.events import EventType, NewEvent
from stackflow.model.release import Operation

ADDRESS_ENV = "STACKFLOW_METRICS_ADDRESS"

RUNS = "stackflow_runs_total"
RESOURCES = "stackflow_resources_total"
RESOURCE_SECONDS = "stackflow_resource_seconds"
STACK_LOCK = "stackflow_stack_lock_total"
POLICY = "stackflow_policy_decisions_total"
NOTIFY_ATTEMPTS = "stackflow_notification_attempts_total"
NOTIFY_UNDELIVERED = "stackflow_notifications_undelivered_total"

RESOURCE_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
"""Seconds one resource's step takes (runtime call, readiness wait, state write)."""

RESOURCE_STEPS = frozenset({"apply_resource", "delete_resource", "run_group"})
OUTCOMES = frozenset({"succeeded", "failed"})
ACTIONS = frozenset(a.value for a in Action)
OPERATIONS = frozenset(o.value for o in Operation)

LockOutcome = Literal["acquired", "refused", "contended", "recovered", "taken_over", "fenced"]
AttemptOutcome = Literal["delivered", "refused", "unavailable", "unreachable"]
Undelivered = Literal["dead_lettered", "not_started"]

OTHER = "other"


def _known(value: str | None, allowed: Iterable[str]) -> str:
    if value is None:
        return "unknown"
    return str(value) if value in allowed else OTHER


def _activity_type() -> str | None:
    return activity.info().activity_type if activity.in_activity() else None


class StackflowMetrics:
    """stackflow's counters and histograms on ``meter``, labelled only from known sets."""

    def __init__(self, meter: MetricMeter, runtimes: Iterable[str] = ()) -> None:
        self.runtimes = frozenset(runtimes)
        self.enabled = meter is not MetricMeter.noop
        self._runs = meter.create_counter(
            RUNS, "Runs that ended (a release became final; a preview ended), by outcome."
        )
        self._resources = meter.create_counter(
            RESOURCES,
            "Resources a walk applied or deleted (succeeded) or failed for good, by runtime, "
            "action and the activity kind (apply_resource, delete_resource, run_group).",
        )
        self._resource_seconds = meter.create_histogram_float(
            RESOURCE_SECONDS, "Seconds one resource's apply or delete took, by runtime.", "s"
        )
        self._lock = meter.create_counter(
            STACK_LOCK,
            "The stack lock: acquired, refused (held by an open run), contended, recovered "
            "(a closed run's lock), taken_over (after a reset), fenced (a write refused).",
        )
        self._policy = meter.create_counter(
            POLICY, "Policy gate decisions (pass, warn, require_approval, deny) and errors."
        )
        self._attempts = meter.create_counter(
            NOTIFY_ATTEMPTS, "Notification delivery attempts, by outcome."
        )
        self._undelivered = meter.create_counter(
            NOTIFY_UNDELIVERED,
            "Notifications given up (dead_lettered) or never started (not_started).",
        )
        self._bound: dict[tuple[object, ...], MetricCounter | MetricHistogramFloat] = {}

    def _counter(self, counter: MetricCounter, **labels: str) -> MetricCounter:
        key = (id(counter), *labels.items())
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = counter.with_additional_attributes(labels)
        assert isinstance(bound, MetricCounter)
        return bound

    def _histogram(self, histogram: MetricHistogramFloat, **labels: str) -> MetricHistogramFloat:
        key = (id(histogram), *labels.items())
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = histogram.with_additional_attributes(labels)
        assert isinstance(bound, MetricHistogramFloat)
        return bound

    # ---- runs ------------------------------------------------------------------------------
    def run_ended(self, operation: str, outcome: str) -> None:
        self._counter(
            self._runs, operation=_known(operation, OPERATIONS), outcome=_known(outcome, OUTCOMES)
        ).add(1)

    def runs_completed(self, operation: str | None, events: Iterable[NewEvent]) -> None:
        """Count each ``run_complete`` among ``events``; ``operation`` None: the calling
        activity's workflow type says it (``PreviewWorkflow`` → ``preview``)."""
        for event in events:
            if event.type != EventType.run_complete:
                continue
            if operation is None:
                info = activity.info() if activity.in_activity() else None
                kind = info.workflow_type if info is not None else None
                operation = (kind or "").removesuffix("Workflow").lower()
            self.run_ended(operation, str(event.data.get("status")))

    # ---- resources -------------------------------------------------------------------------
    def resource_done(
        self,
        resource_type: str | None,
        action: str,
        outcome: Literal["succeeded", "failed"],
        seconds: float | None = None,
    ) -> None:
        """One node of a walk ended (``failed``: for good, not an attempt retried)."""
        if not self.enabled:
            return
        runtime = _known(resource_type, self.runtimes)
        labels = {
            "runtime": runtime,
            "action": _known(action, ACTIONS),
            "step": _known(_activity_type(), RESOURCE_STEPS),
            "outcome": outcome,
        }
        self._counter(self._resources, **labels).add(1)
        if seconds is not None and outcome == "succeeded":
            self._histogram(
                self._resource_seconds, runtime=runtime, action=labels["action"]
            ).record(max(seconds, 0.0))

    # ---- the stack lock, the policy gate, notifications ------------------------------------
    def lock(self, outcome: LockOutcome) -> None:
        self._counter(self._lock, outcome=outcome).add(1)

    def policy(self, outcome: str, bundles: int = 1) -> None:
        """A decision's outcome (``pass``, ``warn``, ``require_approval``, ``deny``) or
        ``error`` (the gate could not decide); not counted without bundles (a run that asked
        only for its policy input)."""
        if bundles:
            known = ("pass", "warn", "require_approval", "deny", "error")
            self._counter(self._policy, outcome=_known(outcome, known)).add(1)

    def notification_attempt(self, outcome: AttemptOutcome) -> None:
        self._counter(self._attempts, outcome=outcome).add(1)

    def notification_undelivered(self, reason: Undelivered) -> None:
        self._counter(self._undelivered, reason=reason).add(1)


_current = StackflowMetrics(MetricMeter.noop)


def current() -> StackflowMetrics:
    """The process's metrics (no-op until :func:`install`)."""
    return _current


def install(meter: MetricMeter, runtimes: Iterable[str]) -> StackflowMetrics:
    """Record on ``meter`` from now on (the worker's runtime), labelling ``runtimes`` by name."""
    global _current
    _current = StackflowMetrics(meter, runtimes)
    return _current


def bind_address(text: str) -> str:
    """``HOST:PORT`` as the SDK's exporter binds it (``IP:PORT``): a name is resolved, an
    empty host is every interface (``:9464`` → ``0.0.0.0:9464``), IPv6 in brackets."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise StackflowError(
            f"{ADDRESS_ENV}={text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464), port 1-65535"
        )
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as err:
            raise StackflowError(f"{ADDRESS_ENV}={text!r}: cannot resolve {host}: {err}") from None
        ip = ipaddress.ip_address(str(found[0][4][0]))
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def prometheus_runtime(address: str) -> Runtime:
    """A Temporal runtime serving its SDK metrics and stackflow's at ``http://address/metrics``
    (durations in seconds; SDK names as Temporal documents them, unsuffixed)."""
    bind = bind_address(address)
    try:
        return Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(
                    bind_address=bind,
                    durations_as_seconds=True,
                    histogram_bucket_overrides={
                        RESOURCE_SECONDS: [float(b) for b in RESOURCE_BUCKETS]
                    },
                ),
                attach_service_name=False,
            )
        )
    except ValueError as err:  # "Failed starting Prometheus exporter: Address already in use"
        raise StackflowError(f"{ADDRESS_ENV}={address!r}: {err}") from None
