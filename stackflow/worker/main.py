"""The stackflow worker: runs the operation workflows and their activities.

`python -m stackflow.worker` (or `stackflow worker`) reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
STACKFLOW_TASK_QUEUE, STACKFLOW_STATE_URL (default: SQLite under STACKFLOW_HOME), REDIS_URL,
STACKFLOW_HOME (local caches only), STACKFLOW_METRICS_ADDRESS (Prometheus metrics, the
Temporal SDK's and stackflow's, at http://ADDRESS/metrics; unset: none) and STACKFLOW_TRACING
(``otlp``: OpenTelemetry spans of runs to an OTLP/HTTP collector, see stackflow.temporal.tracing;
unset:
none) and STACKFLOW_WORKER_PROCESSES (that many worker processes under one supervisor, see
stackflow.worker.processes; default 1), TEMPORAL_TLS* and TEMPORAL_API_KEY (see
stackflow.temporal.tls) and STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS (``1``: a run or an Update
whose input was not encrypted with the keys fails at once with one line; needs keys; default
off), migrates the state backend's schema, registers
everything, and shuts down gracefully on SIGTERM/SIGINT (in-flight activities finish or are
retried elsewhere; buffered spans are sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client, Interceptor
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.runtime import Runtime
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig

from stackflow.activities import WorkerActivities
from stackflow.core import heap
from stackflow.core.config import stackflow_home
from stackflow.core.crypto import EncryptionKeyError, KeyRing
from stackflow.runtimes.policy import WorkerPolicy, worker_policy
from stackflow.runtimes.registry import RuntimeRegistry, default_registry
from stackflow.state.backend import StateBackend, open_backend, redact_url
from stackflow.state.cache import PriorStateCache
from stackflow.state.event_bell import Bell
from stackflow.temporal import client as temporal_client
from stackflow.temporal import metrics, tracing
from stackflow.temporal.codec import (
    REQUIRE_ENCRYPTED_ENV,
    data_converter,
    require_encrypted_from_env,
)
from stackflow.temporal.operation import TASK_QUEUE_DEFAULT
from stackflow.temporal.runtime_queues import RoutingError, Serving, serving
from stackflow.temporal.tls import TemporalTLS
from stackflow.worker import processes as worker_processes
from stackflow.workflows.catalog import ALL_WORKFLOWS

log = logging.getLogger("stackflow.worker.main")
DEPLOYMENT_VAR = "STACKFLOW_WORKER_DEPLOYMENT"
BUILD_VAR = "STACKFLOW_WORKER_BUILD_ID"
GRACEFUL_SHUTDOWN = timedelta(seconds=10)
"""On SIGTERM, in-flight activities get this long to finish before they are cancelled
(and retried on another worker); a pod's grace period must be longer."""


@dataclass(frozen=True)
class WorkerSettings:
    address: str
    namespace: str
    task_queue: str
    redis_url: str | None
    metrics_address: str | None = None
    deployment: WorkerDeploymentVersion | None = None
    """Worker Versioning: this worker's deployment and build (``STACKFLOW_WORKER_DEPLOYMENT``
    and ``STACKFLOW_WORKER_BUILD_ID``; unset: an unversioned worker)."""
    require_encrypted: bool = False
    """``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS``: runs and Updates whose input is not
    encrypted fail (see ``codec.RequireEncrypted``)."""

    @classmethod
    def from_env(cls) -> WorkerSettings:
        return cls(
            address=os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
            task_queue=os.environ.get("STACKFLOW_TASK_QUEUE", TASK_QUEUE_DEFAULT),
            redis_url=os.environ.get("REDIS_URL") or None,
            metrics_address=os.environ.get(metrics.ADDRESS_ENV) or None,
            deployment=deployment_version(os.environ),
            require_encrypted=require_encrypted_from_env(),
        )


def deployment_version(environ: Mapping[str, str]) -> WorkerDeploymentVersion | None:
    """The Worker Versioning version the environment names (both variables, or neither)."""
    name = environ.get(DEPLOYMENT_VAR, "").strip()
    build = environ.get(BUILD_VAR, "").strip()
    if not name and not build:
        return None
    if not name or not build or "." in name:
        raise RoutingError(
            f"{DEPLOYMENT_VAR} and {BUILD_VAR} go together (a deployment name without '.', "
            "and the build id of this worker's code, e.g. its image tag)"
        )
    return WorkerDeploymentVersion(deployment_name=name, build_id=build)


async def connect(
    address: str,
    namespace: str,
    attempts: int = 30,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
    require_encrypted: bool = False,
) -> Client:
    """Connect with retries: after a reboot the server may come up after the worker (a
    refusal, such as a TLS handshake the server rejects, ends it at once). The client's
    ``interceptors`` (tracing) and data converter are its workers' too:
    ``require_encrypted`` refuses runs and Updates with unencrypted input."""
    for attempt in range(1, attempts + 1):
        try:
            return await temporal_client.connect(
                data_converter(require_encrypted=require_encrypted),
                address=address,
                namespace=namespace,
                runtime=runtime,
                interceptors=interceptors,
            )
        except Exception as exc:
            if attempt == attempts or not temporal_client.is_unreachable(exc):
                raise  # a refusal (a TLS handshake, a namespace) does not go away by waiting
            log.warning("Temporal at %s not reachable (%s); retrying", address, exc)
            await asyncio.sleep(min(2.0 * attempt, 10.0))
    raise AssertionError("unreachable")


def build_activities(
    redis_url: str | None,
    registry: RuntimeRegistry | None = None,
    backend: StateBackend | None = None,
    only: frozenset[str] | None = None,
) -> WorkerActivities:
    backend = backend or open_backend(migrate=True)
    return WorkerActivities.create(
        registry=registry or default_registry(backend, only),
        backend=backend,
        cache=PriorStateCache(redis_url, backend),
        bell=Bell(redis_url) if redis_url else None,
    )


def build_worker(
    client: Client,
    task_queue: str,
    activities: WorkerActivities,
    max_concurrent: int = 64,
    workflows: bool = True,
    deployment: WorkerDeploymentVersion | None = None,
) -> Worker:
    """A Temporal worker of ``task_queue``: the workflows and every activity (a runtime's
    own queue: its activities only, no workflows). With a ``deployment`` version, runs are
    PINNED to the build they started on: a run waiting hours for approval finishes on the
    code that made its preview; a new build takes new runs once it is made current."""
    versioning = (
        WorkerDeploymentConfig(
            version=deployment,
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        )
        if deployment is not None
        else None
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS if workflows else [],
        activities=activities.all() if workflows else activities.runtime_calls(),
        max_concurrent_activities=max_concurrent,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        deployment_config=versioning,
        # The workflow modules import all of stackflow passed through the sandbox, so its
        # checks reached only their few lines of module code, at a cost per run (the modules
        # re-executed, every payload's context asked through compiled code): about a fifth of
        # the worker's CPU for a small run. The sandboxed Replayer of the golden histories
        # still checks them (tests/unit/test_golden_replay.py).
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def run(settings: WorkerSettings, runtimes: str | None = None) -> None:
    policy, serves = check(settings, runtimes)
    # one endpoint: the SDK's metrics and stackflow's, on the runtime the client connects with
    runtime = (
        metrics.prometheus_runtime(settings.metrics_address) if settings.metrics_address else None
    )
    traced = tracing.interceptors(tracing.WORKER)  # [] unless STACKFLOW_TRACING=otlp
    try:
        await _serve(settings, serves, runtime, traced, policy.summary())
    finally:
        tracing.shutdown()  # the spans still buffered go out before the process does


async def _serve(
    settings: WorkerSettings,
    serves: Serving,
    runtime: Runtime | None,
    traced: Sequence[Interceptor],
    policy: str,
) -> None:
    client = await connect(
        settings.address,
        settings.namespace,
        runtime=runtime,
        interceptors=traced,
        require_encrypted=settings.require_encrypted,
    )
    activities = build_activities(settings.redis_url, only=serves.types)
    if runtime is not None:
        metrics.install(runtime.metric_meter, activities.registry.types())
    workers = [
        build_worker(
            client,
            queue,
            activities,
            workflows=queue == settings.task_queue,
            deployment=settings.deployment,
        )
        for queue in serves.task_queues(settings.task_queue)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        heap.freeze_started()  # what every run shares stays out of each collection
        queues = ", ".join(repr(q) for q in serves.task_queues(settings.task_queue))
        built = "all" if serves.types is None else ",".join(sorted(serves.types)) or "none"
        build = settings.deployment.to_canonical_string() if settings.deployment else "unversioned"
        index = worker_processes.describe_index(os.environ)
        placed = f"; {index}" if index else ""
        print(
            f"stackflow worker ready: task queue {queues} on {settings.address} "
            f"(namespace {settings.namespace}, state {redact_url(activities.backend.url)}, "
            f"home {stackflow_home()}, Temporal over {TemporalTLS.from_env().describe()}, "
            f"payloads {_payloads(settings)}, "
            f"runtimes {built}, "
            f"build {build}{placed})",
            flush=True,
        )
        print(f"stackflow worker policy: {policy}", flush=True)
        if settings.metrics_address:
            print(
                f"stackflow worker metrics: http://{settings.metrics_address}/metrics", flush=True
            )
        if traced:
            print(f"stackflow worker tracing: OTLP to {tracing.endpoint()}", flush=True)
        orphan_watch = (
            asyncio.ensure_future(worker_processes.stop_when_orphaned(stop)) if index else None
        )
        await stop.wait()
        if orphan_watch is not None:
            orphan_watch.cancel()
        print("stackflow worker stopping (SIGTERM)", flush=True)
    await activities.registry.close()
    activities.backend.close()


def check(settings: WorkerSettings, runtimes: str | None) -> tuple[WorkerPolicy, Serving]:
    """What a worker checks before it starts (its policy and what it serves): a bad policy,
    key or routing setting stops it here, with the same message whether one process starts
    or many."""
    policy = worker_policy()
    keys = KeyRing.from_env()
    TemporalTLS.from_env()
    if settings.require_encrypted and keys is None:
        raise EncryptionKeyError(
            f"{REQUIRE_ENCRYPTED_ENV}=1 needs the payload keys: set STACKFLOW_ENCRYPTION_KEY "
            "or STACKFLOW_ENCRYPTION_KEY_FILE (the ones the clients and the codec server use)"
        )
    return policy, serving(settings.task_queue, runtimes)


def _payloads(settings: WorkerSettings) -> str:
    if KeyRing.from_env() is None:
        return "NOT encrypted (no key configured)"
    if settings.require_encrypted:
        return "encrypted, unencrypted input refused"
    return "encrypted"


def main(runtimes: str | None = None, processes: str | None = None) -> None:
    """``runtimes``: what ``--runtimes`` says (else ``STACKFLOW_WORKER_RUNTIMES``, else all);
    ``processes``: what ``--processes`` says (else ``STACKFLOW_WORKER_PROCESSES``, else 1)."""
    heap.limit_malloc_arenas()  # before any thread starts
    os.umask(0o077)  # every file and directory the worker writes: 0600 / 0700
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = WorkerSettings.from_env()
    count = worker_processes.process_count(
        processes if processes is not None else os.environ.get(worker_processes.PROCESSES_ENV)
    )
    if count > 1:
        check(settings, runtimes)
        sys.exit(worker_processes.supervise(count, runtimes, settings.metrics_address))
    asyncio.run(run(settings, runtimes))


def shell_main(runtimes: str | None = None, processes: str | None = None) -> None:
    """``python -m stackflow.worker`` and ``stackflow worker``: ``main``, where a setting it
    refuses or a Temporal that refuses it (a TLS handshake) is one line on stderr and its
    exit code, not a traceback. The process then ends at once (``os._exit``): the SDK's core
    may still be winding the refused connections down, and a Python finalizing under it
    can abort (SIGABRT, "PyGILState_Release") instead of exiting with the code."""
    try:
        main(runtimes, processes)
    except Exception as exc:
        err = temporal_client.connection_error(exc)
        if err is None:
            raise
        print("Error: " + " ".join(str(err).split()), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(err.exit_code)
