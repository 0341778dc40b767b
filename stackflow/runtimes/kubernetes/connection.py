"""Reaching a cluster: clients per kubeconfig and context, the runtime's own threads,
discovery (waiting for a kind being established), reads and listings, and what this worker
learnt of the clusters' namespaces. The Kubernetes runtime holds one
(``KubernetesRuntime.kube``)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from stackflow.core.refs import RunRef
from stackflow.runtimes.base import (
    READ_SCOPE,
    InvalidInput,
    ReadScope,
    ResourceRequest,
    RuntimeFailure,
    RuntimeOptions,
)
from stackflow.runtimes.kubernetes.client import (
    JSON,
    POOL_CONNECTIONS,
    ApiError,
    ApiResource,
    KubeClient,
    connect,
)
from stackflow.runtimes.kubernetes.failures import (
    DISCOVERY_WAIT_SECONDS,
    failure,
    unserved_error,
)
from stackflow.runtimes.kubernetes.fresh import FreshNamespaces
from stackflow.runtimes.kubernetes.manifest import (
    ObjectRef,
    check_id,
)
from stackflow.runtimes.kubernetes.policy import check_kubeconfig, check_object
from stackflow.runtimes.kubernetes.snapshot import (
    LIST_AT_LEAST,
    NEVER_LISTED,
    Listing,
    Snapshots,
    list_objects,
)
from stackflow.runtimes.policy import WorkerPolicy, worker_policy

T = TypeVar("T")
REQUEST_THREADS = POOL_CONNECTIONS
"""Blocking API calls the runtime runs at once (one connection each)."""


def scope_key(attributes: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What a preview batch's reads are counted by (:class:`runtimes.base.ReadScope`): one
    listing of a kind in a namespace answers all the batch's reads of it."""
    metadata = attributes.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return (attributes.get("apiVersion"), attributes.get("kind"), namespace)


def snapshot_key(
    scope: ReadScope, client: KubeClient, api: ApiResource, namespace: str | None
) -> tuple[str, int, str]:
    """Where a run's listing of a kind in a namespace (or the cluster) is kept."""
    return (scope.run, id(client), api.path(namespace))


ABSENT_NAMESPACE_SECONDS = 2.0
"""How long a preview trusts a dry run's "namespace not found": the objects of a stack that
creates its namespace are previewed without one GET and one dry run each."""


class KubeConnection:
    """The Kubernetes runtime's connections: one client per kubeconfig and context (the
    worker policy decides which), threads of its own for blocking API calls, discovery of
    the kinds the server serves, single reads and listings kept as a run's snapshot, and
    the namespaces a dry run found missing or a run created."""

    def __init__(self, policy: WorkerPolicy | None = None) -> None:
        self._clients: dict[tuple[str | None, str | None], KubeClient] = {}
        self._lock = threading.Lock()
        self._policy = policy
        self._absent_namespaces: dict[tuple[int, str], float] = {}
        self.fresh_namespaces = FreshNamespaces()
        """Namespaces a run created on this worker (nothing in them predates it)."""
        self._doomed: OrderedDict[tuple[str, int, str], None] = OrderedDict()
        """(run, client, namespace): the run's preview on this worker previewed its deletion."""
        self._snapshots = Snapshots()
        # Requests block a thread each: threads of its own, as many as a client's connection
        # pool holds, so API calls are not capped by the event loop's default executor
        # (min(32, CPUs + 4) threads, shared with every other blocking call of the worker).
        self._threads: ThreadPoolExecutor | None = None

    @property
    def policy(self) -> WorkerPolicy:
        return self._policy if self._policy is not None else worker_policy()

    def namespace_absent(
        self, client: KubeClient, namespace: str | None, *, seen_absent: bool = False
    ) -> bool:
        """Whether a dry run found ``namespace`` missing within the last few seconds
        (``seen_absent``: one just did); only previews rely on it."""
        if not namespace:
            return False
        key, now = (id(client), namespace), time.monotonic()
        with self._lock:
            if seen_absent:
                self._absent_namespaces[key] = now + ABSENT_NAMESPACE_SECONDS
                return True
            until = self._absent_namespaces.get(key)
            if until is not None and until <= now:
                del self._absent_namespaces[key]
            return until is not None and until > now

    def namespace_applied(
        self, client: KubeClient, name: str, *, created: bool, owner: RunRef | None
    ) -> None:
        """The Namespace ``name`` was applied (``created``: by this apply, for ``owner``'s
        run): no longer missing, and when this run made it, fresh."""
        with self._lock:
            self._absent_namespaces.pop((id(client), name), None)
        if created and owner is not None:
            self.fresh_namespaces.add(id(client), name, owner)

    async def call(self, rid: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking step in one of the runtime's threads; every failure names the
        resource."""
        threads = self._threads  # made and dropped on the event loop's thread only
        if threads is None:
            threads = self._threads = ThreadPoolExecutor(
                REQUEST_THREADS, thread_name_prefix="stackflow-kube"
            )
        context = contextvars.copy_context()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                threads, functools.partial(context.run, fn, *args)
            )
        except RuntimeFailure as exc:
            if exc.resource_id is None:
                raise type(exc)(f"{rid}: {exc}", resource_id=rid) from None
            raise
        except ApiError as exc:  # a request no step mapped (none should be left)
            raise failure(exc, rid, "request") from None

    # ---- connection & discovery ----------------------------------------------------------
    @staticmethod
    def _cluster(
        resource: ResourceRequest, options: RuntimeOptions
    ) -> tuple[tuple[str | None, str], tuple[str | None, str]]:
        """(kubeconfig, the field naming it), (context, its field): the resource's
        extensions, else the spec context; no kubeconfig: the worker's own."""
        ext, ctx = resource.extensions, options.context
        picked = []
        for name in ("kubeConfig", "kubeContext"):
            field, value = f"extensions.{name}", ext.get(name)
            if not value:
                field, value = f"context.{name}", ctx.get(name)
            if value is not None and not isinstance(value, str):
                raise InvalidInput(
                    f"{resource.id}: {field} must be a string", resource_id=resource.id
                )
            picked.append((value or None, field))
        return picked[0], picked[1]

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        (kubeconfig, config_field), (context, context_field) = self._cluster(resource, options)
        policy = self.policy.for_project(options.project, resource.id)
        check_object(policy, resource.id, resource.attributes)
        check_kubeconfig(
            policy,
            resource.id,
            kubeconfig,
            context,
            config_field=config_field,
            context_field=context_field,
        )

    def client_for(self, resource: ResourceRequest, options: RuntimeOptions) -> KubeClient:
        # the worker policy, every time: before a kubeconfig is loaded or a client reused
        self.check_policy(resource, options)
        (kubeconfig, _), (context, _) = self._cluster(resource, options)
        key = (kubeconfig or os.environ.get("KUBECONFIG") or None, context)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = connect(*key)
            return found

    def api(
        self, client: KubeClient, resource: ResourceRequest, ref: ObjectRef, wait: float = 0.0
    ) -> ApiResource | None:
        """Where objects of the resource's kind live; None while the kind is not served."""
        deadline = time.monotonic() + wait
        try:
            while True:
                api = client.resource_for(ref.api_version, ref.kind)
                if api is not None or time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        except ApiError as exc:
            raise failure(exc, resource.id, f"discovery of {ref.api_version}") from None
        check_id(resource, ref, None if api is None else api.namespaced)
        return api

    def served_api(
        self, client: KubeClient, resource: ResourceRequest, ref: ObjectRef
    ) -> ApiResource:
        """Where objects of the kind live, for an apply: a kind whose CRD was just applied
        is waited for (it is being established); one nothing would serve fails at once."""
        api = self.api(client, resource, ref) or self.unserved(client, resource, ref, wait=True)
        assert api is not None  # _unserved(wait=True) raises instead
        return api

    def unserved(
        self, client: KubeClient, resource: ResourceRequest, ref: ObjectRef, *, wait: bool
    ) -> ApiResource | None:
        """The kind is not served: InvalidInput when nothing in the cluster would serve it.
        Else ``wait`` waits a while for it, then raises Unavailable (InvalidInput when the
        cluster would not say why); without ``wait``, None."""
        try:
            reason, soon = client.unserved(ref.api_version, ref.kind)
        except ApiError as exc:
            raise failure(exc, resource.id, f"discovery of {ref.api_version}") from None
        if soon is not False:
            if not wait:
                return None
            api = self.api(client, resource, ref, wait=DISCOVERY_WAIT_SECONDS)
            if api is not None:
                return api
        raise unserved_error(resource.id, ref, reason, soon)

    def get(
        self, client: KubeClient, api: ApiResource, ref: ObjectRef, rid: str, *, fresh: bool = False
    ) -> JSON | None:
        """The object as the server holds it (``fresh``: now, never from a listing)."""
        listing = None if fresh else self._listing(client, api, ref)
        if listing is not None:
            return listing.get(ref.name)
        try:
            return client.request("GET", api.path(ref.namespace, ref.name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise failure(exc, rid, f"reading {ref.describe()}") from None

    def _listing(self, client: KubeClient, api: ApiResource, ref: ObjectRef) -> Listing | None:
        """In a preview batch that reads many objects of this kind and namespace, all of
        them from one listing (see runtimes.kubernetes.snapshot); else None."""
        scope = READ_SCOPE.get()
        namespace = ref.namespace if api.namespaced else None
        if (
            scope is None
            or not scope.lists
            or (ref.api_version, ref.kind) in NEVER_LISTED
            or scope.count(scope_key, (ref.api_version, ref.kind, namespace)) < LIST_AT_LEAST
        ):
            return None
        # the listing serves the run's later batches too: weighed against what they read
        wanted = scope.run_count(scope_key, (ref.api_version, ref.kind, namespace))
        return self._snapshots.get(
            snapshot_key(scope, client, api, namespace),
            lambda: list_objects(client, api, namespace, wanted),
        )

    def note_deleting(self, rid: str, client: KubeClient, ref: ObjectRef) -> None:
        """A read of the Namespace ``ref`` that previews its deletion by the run: the run's
        deletes of objects in it may leave their dependents to the namespace controller."""
        scope = READ_SCOPE.get()
        if scope is None or rid not in scope.deleting or ref.kind != "Namespace":
            return
        with self._lock:
            self._doomed[(scope.run, id(client), ref.name)] = None
            while len(self._doomed) > FreshNamespaces.SIZE:
                self._doomed.popitem(last=False)

    def namespace_goes(self, client: KubeClient, namespace: str | None) -> bool:
        """Whether this run deletes ``namespace`` (after its objects), as its preview on this
        worker showed."""
        scope = READ_SCOPE.get()
        return bool(namespace and scope and (scope.run, id(client), namespace) in self._doomed)

    def previewed(self, client: KubeClient, api: ApiResource, ref: ObjectRef) -> JSON | None:
        """The object as the run's preview listed it on this worker, if it did."""
        scope = READ_SCOPE.get()
        if scope is None:
            return None
        namespace = ref.namespace if api.namespaced else None
        listing = self._snapshots.peek(snapshot_key(scope, client, api, namespace))
        return None if listing is None else listing.get(ref.name)

    def close(self) -> None:
        """Stop the threads and close every client (the next call starts afresh)."""
        threads, self._threads = self._threads, None
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
        for client in clients:
            client.close()
