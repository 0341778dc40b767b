"""The stackflow worker: runs the operation workflows and their activities.

`python -m stackflow.worker` (or `stackflow worker`) reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
STACKFLOW_TASK_QUEUE, STACKFLOW_STATE_URL (default: SQLite under STACKFLOW_HOME), REDIS_URL,
STACKFLOW_HOME (local caches only) and STACKFLOW_METRICS_ADDRESS (Prometheus metrics, the
Temporal SDK's and stackflow's, at http://ADDRESS/metrics; unset: none), migrates the state
backend's schema, registers everything, and shuts down gracefully on SIGTERM/SIGINT
(in-flight activities finish or are retried elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from stackflow import metrics
from stackflow.activities import WorkerActivities
from stackflow.cache import PriorStateCache
from stackflow.codec import data_converter
from stackflow.config import default_backend, stackflow_home
from stackflow.crypto import KeyRing
from stackflow.operation import TASK_QUEUE_DEFAULT
from stackflow.policy import worker_policy
from stackflow.runtimes.registry import RuntimeRegistry, default_registry
from stackflow.state.backend import StateBackend, redact_url
from stackflow.workflows.catalog import ALL_WORKFLOWS

log = logging.getLogger("stackflow.worker")


@dataclass(frozen=True)
class WorkerSettings:
    address: str
    namespace: str
    task_queue: str
    redis_url: str | None
    metrics_address: str | None = None

    @classmethod
    def from_env(cls) -> WorkerSettings:
        return cls(
            address=os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
            task_queue=os.environ.get("STACKFLOW_TASK_QUEUE", TASK_QUEUE_DEFAULT),
            redis_url=os.environ.get("REDIS_URL") or None,
            metrics_address=os.environ.get(metrics.ADDRESS_ENV) or None,
        )


async def connect(
    address: str, namespace: str, attempts: int = 30, runtime: Runtime | None = None
) -> Client:
    """Connect with retries: after a reboot the server may come up after the worker."""
    for attempt in range(1, attempts + 1):
        try:
            return await Client.connect(
                address, namespace=namespace, data_converter=data_converter(), runtime=runtime
            )
        except Exception as exc:
            if attempt == attempts:
                raise
            log.warning("Temporal at %s not reachable (%s); retrying", address, exc)
            await asyncio.sleep(min(2.0 * attempt, 10.0))
    raise AssertionError("unreachable")


def build_activities(
    redis_url: str | None,
    registry: RuntimeRegistry | None = None,
    backend: StateBackend | None = None,
) -> WorkerActivities:
    backend = backend or default_backend(migrate=True)
    return WorkerActivities.create(
        registry=registry or default_registry(backend),
        backend=backend,
        cache=PriorStateCache(redis_url, backend),
    )


def build_worker(
    client: Client, task_queue: str, activities: WorkerActivities, max_concurrent: int = 64
) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS,
        activities=activities.all(),
        max_concurrent_activities=max_concurrent,
        graceful_shutdown_timeout=timedelta(seconds=10),
    )


async def run(settings: WorkerSettings) -> None:
    policy = worker_policy()  # a bad policy or key setting stops the worker here, not later
    KeyRing.from_env()
    # one endpoint: the SDK's metrics and stackflow's, on the runtime the client connects with
    runtime = (
        metrics.prometheus_runtime(settings.metrics_address) if settings.metrics_address else None
    )
    client = await connect(settings.address, settings.namespace, runtime=runtime)
    activities = build_activities(settings.redis_url)
    if runtime is not None:
        metrics.install(runtime.metric_meter, activities.registry.types())
    worker = build_worker(client, settings.task_queue, activities)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print(
            f"stackflow worker ready: task queue {settings.task_queue!r} on {settings.address} "
            f"(namespace {settings.namespace}, state {redact_url(activities.backend.url)}, "
            f"home {stackflow_home()}, payloads "
            f"{'encrypted' if KeyRing.from_env() else 'NOT encrypted (no key configured)'})",
            flush=True,
        )
        print(f"stackflow worker policy: {policy.summary()}", flush=True)
        if settings.metrics_address:
            print(
                f"stackflow worker metrics: http://{settings.metrics_address}/metrics", flush=True
            )
        await stop.wait()
        print("stackflow worker stopping (SIGTERM)", flush=True)
    await activities.registry.close()
    activities.backend.close()


def main() -> None:
    os.umask(0o077)  # every file and directory the worker writes: 0600 / 0700
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(run(WorkerSettings.from_env()))


if __name__ == "__main__":
    main()
