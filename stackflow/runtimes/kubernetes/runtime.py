"""Kubernetes runtime: server-side apply, dry-run preview, readiness, ownership, deletion.

How it behaves, in one place:

- **Cluster.** ``extensions.kubeConfig`` / ``extensions.kubeContext`` of the resource, else
  the spec context's ``kubeConfig`` / ``kubeContext`` (``RuntimeOptions.context``), else
  ``KUBECONFIG`` (or ~/.kube/config), else the in-cluster service account. The worker policy
  (:mod:`stackflow.runtimes.policy`) decides which kubeconfigs and contexts specs may name, and
  refuses exec and auth-provider plugins unless allowed, before a kubeconfig is loaded.
  One client per (kubeconfig, context), with its own discovery cache; a kind missing from
  the cache is re-discovered, so a CRD applied earlier in the same run is found.
- **Apply** is server-side apply with field manager ``stackflow``. A field conflict with
  another manager fails as ``Conflict`` naming the managers and fields, unless ``force``
  (run option or ``extensions.force``). One exception, *drift repair*: when every
  conflicting field is one the last release recorded with the very value the spec still
  asks for, someone changed it behind stackflow's back and stackflow takes it back
  (forces just that apply). A field the spec newly sets or changes while another manager
  owns it still conflicts.
- **Preview** is the same apply with ``dryRun=All`` (none when the live object shows the
  apply would change nothing, :mod:`.unchanged`); ``would_be`` is its answer reduced to the
  manifest's fields plus any other the apply changes, removals as ``removed_paths``
  (:func:`.manifest.previewed`). A create whose namespace (or CRD) an earlier node of the
  same run makes previews as the manifest itself.
- **read** returns the live object without ``status`` and server bookkeeping
  (``managedFields``, ``resourceVersion``, ``uid``, timestamps, ``generation``); the diff
  projects it onto ``would_be`` anyway, and what is recorded stays stable between applies.
  In a preview batch that reads many objects of one kind and namespace, one paginated LIST
  answers them, kept as the run's snapshot on this worker (:mod:`.snapshot`).
- **Ownership**, as Helm does it: annotations ``stackflow.io/project`` and
  ``stackflow.io/workspace`` (plus labels, and ``app.kubernetes.io/managed-by:
  stackflow``) on every object. Another stack's object is never applied or deleted; an
  existing unowned object is taken over only with ``adopt`` (run option or
  ``extensions.adopt``). The markers are part of the applied manifest, so preview shows
  them only when they are really missing. An object not recorded yet is read before its
  apply to check this, except a new object in a namespace the same run created on this
  worker (nothing by its name can predate the namespace): its apply must then be answered
  201 Created; a 200 means someone created it meanwhile, and the fields the apply set are
  withdrawn (an empty apply by the same field manager) before it fails as ``Conflict``.
- **Delete** reads the object (uid, owner) and deletes it on the condition that it is that
  object (uid precondition), or, when the run's preview listed it on this worker, deletes
  the listed object on the condition that it is unchanged (uid and resourceVersion) with no
  read. It waits until the object is gone. Kubernetes' own kinds that own others
  (Deployment, Job, …) go with foreground propagation (dependents first); built-in kinds
  nothing owns (ConfigMap, Secret, Service, Namespace, RBAC objects, …, see ``LEAF_KINDS``)
  and custom resources go with background propagation as ``kubectl delete`` does (their
  dependents, if a controller made any, are removed by the garbage collector after them),
  which spares each one a round through the garbage collector (rate-limited: ~14
  objects/s), and a custom resource the wait until the collector's discovery resync has
  found its kind (every 30 s; none while an aggregated API is unavailable): 20 s of a
  cert-manager bundle's destroy. An object in a Namespace the same run deletes (its preview
  on this worker previewed that deletion) goes in the background too: the Namespace is
  deleted after it and waited for, and is gone only once all it held is, dependents too.
  ``extensions.deletionPropagation`` (``Foreground``, ``Background``, ``Orphan``) overrides
  any of these.
- **Readiness** (``wait_ready``) polls the object: rollouts, Job completion, PVC bound,
  Namespace active, CRD established, else a ``Ready`` condition; the timeout is
  ``extensions.readinessTimeout`` or the run's ``timeout_seconds``.
- **CustomResourceDefinitions.** Applying one returns only once its kind is served:
  ``NamesAccepted`` and ``Established`` True and discovery of each served version listing
  the kind (asked again, so this client's cache is fresh), within ``readinessTimeout``
  (default ``CRD_READY_SECONDS``) else ``NotReady``; names another CRD holds are
  ``InvalidInput`` at once. A custom resource whose apply is answered 404 for no missing
  namespace (``404 page not found``: discovery cached from before its CRD was made again,
  or a CRD still being established) has its kind discovered again and the apply retried
  while the kind is on its way (``Unavailable`` past ``DISCOVERY_WAIT_SECONDS``); a kind no
  CRD in the cluster defines is ``InvalidInput`` saying so. Deleting a CRD drops its
  group from the discovery cache; a custom resource whose kind is gone counts as deleted.
- **Errors** (:func:`failure`), each one line naming the resource:
  an admission denial (a ValidatingAdmissionPolicy's, whatever its status: 422, 403, ...; an
  admission webhook's) -> ``Denied`` (error type ``PolicyDenied``, exit 2, never retried)
  naming the policy and its binding (or the webhook) with the policy's message, the
  resource's sensitive values masked: a preview's dry run meets it before anything is
  applied; 400 BadRequest and 422 Invalid (naming the fields of ``details.causes``) ->
  ``InvalidInput`` with the server's message; server-side apply's 500 "failed to create
  typed patch object" (a value of the wrong type, a field not in the schema) ->
  ``InvalidInput`` naming the field paths; 401/403 -> ``InvalidInput`` (credentials and RBAC
  are fixed by people, not by retrying), except the transient 403 of a namespace being
  terminated -> ``Unavailable``; 409 -> ``Conflict``; 404 -> ``NotFound``; a kind nothing in
  the cluster serves (no such apiVersion, no CRD) -> ``InvalidInput`` naming kind and
  apiVersion at once, while a CRD that exists but is not established yet is waited for; 408,
  410, 429, other 5xx, refused or reset connections, timeouts, DNS failures ->
  ``Unavailable`` naming the server (retried); a TLS certificate the kubeconfig does not
  trust -> ``InvalidInput``.
"""

from __future__ import annotations

import asyncio
import time

from stackflow.runtimes.base import (
    Attributes,
    Conflict,
    InvalidInput,
    NotFound,
    PreviewResult,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.kubernetes.client import (
    APPLY_PATCH,
    JSON,
    ApiError,
    ApiResource,
    KubeClient,
)
from stackflow.runtimes.kubernetes.connection import KubeConnection
from stackflow.runtimes.kubernetes.failures import (
    DISCOVERY_WAIT_SECONDS,
    KindNotServed,
    NotReady,
    ObjectChanged,
    default_propagation,
    deleted_at_once,
    failure,
    namespace_missing,
    one_line,
)
from stackflow.runtimes.kubernetes.fresh import HTTP_CREATED, appeared
from stackflow.runtimes.kubernetes.manifest import (
    FIELD_MANAGER,
    ObjectRef,
    check_owner,
    conflict_fields,
    desired_object,
    drift_repair,
    normalise,
    object_ref,
    owner_of,
    previewed,
    shaped_like,
)
from stackflow.runtimes.kubernetes.readiness import (
    Readiness,
    crd_served_kinds,
    custom_resource_definition,
    is_crd,
    parse_timeout,
    readiness,
)
from stackflow.runtimes.kubernetes.rules import TYPE_NAME
from stackflow.runtimes.kubernetes.unchanged import applies_unchanged
from stackflow.runtimes.policy import WorkerPolicy

CRD_READY_SECONDS = 60.0
"""How long applying a CustomResourceDefinition waits (unless ``extensions.readinessTimeout``
says otherwise) until it is Established, its names accepted and its kind served."""
DRY_RUN_ATTEMPTS = 3
"""How many times a preview reads an object again, and dry-runs onto what it read, when the
object changed between its read and its dry run (a controller writing its status)."""


class KubernetesRuntime(Runtime):
    """Any Kubernetes object, built-in or custom, by server-side apply."""

    type_name = TYPE_NAME
    checks_every_call = True  # each call starts with kube.client_for, which checks the policy

    def __init__(self, policy: WorkerPolicy | None = None) -> None:
        self.kube = KubeConnection(policy)
        """The clusters: clients, threads, discovery, reads and listings."""

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self.kube.check_policy(resource, options)

    # ---- read ----------------------------------------------------------------------------
    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return await self.kube.call(resource.id, self._read, resource, options)

    def _read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        client = self.kube.client_for(resource, options)
        ref = object_ref(resource)
        self.kube.note_deleting(resource.id, client, ref)
        api = self.kube.api(client, resource, ref)
        if api is None:
            return None  # the kind is not served (yet): no such object can exist
        live = self.kube.get(client, api, ref, resource.id)
        return None if live is None else normalise(live)

    # ---- preview & apply -----------------------------------------------------------------
    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        _, result = await self.kube.call(resource.id, self._preview, resource, options)
        return result

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """One GET serves both the live object and the preview (then the dry-run apply)."""
        if not with_preview:
            return await self.read(resource, options), None
        live, result = await self.kube.call(resource.id, self._preview, resource, options)
        return (None if live is None else normalise(live)), result

    def _preview(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> tuple[JSON | None, PreviewResult]:
        """(the object as read, None if absent; the preview)."""
        client = self.kube.client_for(resource, options)
        ref = object_ref(resource)
        desired = desired_object(resource, options)
        sensitive = ["data"] if ref.kind == "Secret" and ref.api_version == "v1" else []
        api = self.kube.api(client, resource, ref)
        if api is None:
            if "." not in ref.api_version.rpartition("/")[0]:  # a built-in group never grows
                self.kube.unserved(client, resource, ref, wait=False)
            # else a custom kind whose CRD an earlier node of this run creates
            return None, PreviewResult(would_be=desired, sensitive_paths=sensitive)
        if api.namespaced and self.kube.namespace_absent(client, ref.namespace):
            # nothing can exist in a namespace that does not: an earlier node creates it
            return None, PreviewResult(would_be=desired, sensitive_paths=sensitive)
        live = self.kube.get(client, api, ref, resource.id)
        if live is not None:
            check_owner(resource, ref, live, options)
            if applies_unchanged(desired, live):  # its dry run would answer live itself
                would_be = shaped_like(normalise(live), desired)
                return live, PreviewResult(would_be=would_be, sensitive_paths=sensitive)
        try:
            _, result = self._server_side_apply(
                client, api, ref, resource, options, desired, dry_run=True
            )
        except NotFound as exc:
            if isinstance(exc, KindNotServed):  # discovery was cached before its CRD went
                client.forget(ref.api_version)
            if live is None:  # its namespace or CRD is created by an earlier node of this run
                return None, PreviewResult(would_be=desired, sensitive_paths=sensitive)
            raise
        shown = previewed(desired, live, result)
        for _ in range(DRY_RUN_ATTEMPTS):
            if shown is not None:
                break
            # changed since it was read or listed: read what the dry run merged onto, and
            # when it changed again since, dry-run onto the object as read now
            live = self.kube.get(client, api, ref, resource.id, fresh=True)
            if live is None:
                break  # gone meanwhile: shown as a create
            shown = previewed(desired, live, result)
            if shown is None:
                _, result = self._server_side_apply(
                    client, api, ref, resource, options, desired, dry_run=True
                )
                shown = previewed(desired, live, result)
        shown = shown or previewed(desired, None, result)
        assert shown is not None
        would_be, removed = shown
        return live, PreviewResult(
            would_be=would_be, sensitive_paths=sensitive, removed_paths=removed
        )

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        attrs = resource.attributes
        definition = is_crd(str(attrs.get("apiVersion")), str(attrs.get("kind")))
        timeout = 0.0
        if definition:  # how long it may take to be served: checked before it is applied
            timeout = self._readiness_timeout(resource) or min(
                CRD_READY_SECONDS, options.timeout_seconds
            )
        client, ref, result = await self.kube.call(resource.id, self._apply, resource, options)
        if definition:
            result = await self._crd_serving(client, resource, ref, result, timeout)
        return normalise(result)

    async def _crd_serving(
        self,
        client: KubeClient,
        resource: ResourceRequest,
        ref: ObjectRef,
        crd: JSON,
        timeout: float,
    ) -> JSON:
        """Wait until the CustomResourceDefinition just applied (``crd``: the server's
        answer) is Established, its names accepted and its kind listed by discovery of
        every version it serves (this client's discovery cache refreshed for each): custom
        resources of it applied next find their kind served. NotReady past ``timeout``
        seconds (``readinessTimeout``, default ``CRD_READY_SECONDS``), InvalidInput for names
        another CRD holds."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            self._refuse_terminating(resource, ref, crd)  # deleted meanwhile: retried
            state = custom_resource_definition(crd)
            if state.failed:
                raise InvalidInput(
                    f"{resource.id}: {ref.describe()}: {state.message}", resource_id=resource.id
                )
            if state.ready:
                kinds = crd_served_kinds(crd)
                missing = await self.kube.call(resource.id, client.undiscovered, kinds)
                if not missing:
                    return crd
                state = Readiness(False, f"discovery does not list it in {', '.join(missing)}")
            if time.monotonic() >= deadline:
                raise NotReady(
                    f"{resource.id}: {ref.describe()} does not serve its kind {timeout:g}s "
                    f"after it was applied: {state.message} (extensions.readinessTimeout "
                    "waits longer)",
                    resource_id=resource.id,
                )
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.25)
            api = await self.kube.call(resource.id, self.kube.api, client, resource, ref)
            assert api is not None  # the apply just used it
            live = await self.kube.call(resource.id, self.kube.get, client, api, ref, resource.id)
            if live is None:
                raise Unavailable(
                    f"{resource.id}: {ref.describe()} was deleted while stackflow waited for "
                    "it to be established",
                    resource_id=resource.id,
                )
            crd = live

    def _apply(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> tuple[KubeClient, ObjectRef, JSON]:
        """(the client, the object, the server's answer to the apply)."""
        client = self.kube.client_for(resource, options)
        ref = object_ref(resource)
        desired = desired_object(resource, options)
        api = self.kube.served_api(client, resource, ref)
        prior = resource.prior_state
        # An object this stack recorded with its own ownership markers is this stack's (no
        # other stack applies or adopts an owned object): apply without reading it first.
        ours = prior is not None and owner_of(prior) == options.stack
        # So is a new object in a namespace this run created: nothing was there before it;
        # the apply must create it (201), which is checked below.
        fresh = not ours and self.kube.fresh_namespaces.claim_for(
            client, api, ref, resource, options
        )
        if not ours and not fresh:
            live = self.kube.get(client, api, ref, resource.id)
            if live is not None:
                self._refuse_terminating(resource, ref, live)
                check_owner(resource, ref, live, options)
        try:
            status, result = self._apply_served(client, api, ref, resource, options, desired)
        except KindNotServed:
            raise
        except NotFound as exc:
            raise NotFound(
                f"{exc} (does its namespace exist? add the Namespace to the spec and make this "
                "resource depend on it)",
                resource_id=resource.id,
            ) from None
        if fresh and status != HTTP_CREATED:
            appeared(client, api, ref, resource)
        self._refuse_terminating(resource, ref, result)
        if ref.kind == "Namespace" and ref.api_version == "v1":
            created = status == HTTP_CREATED
            self.kube.namespace_applied(client, ref.name, created=created, owner=options.owner)
        return client, ref, result

    def _apply_served(
        self,
        client: KubeClient,
        api: ApiResource,
        ref: ObjectRef,
        resource: ResourceRequest,
        options: RuntimeOptions,
        desired: JSON,
    ) -> tuple[int, JSON]:
        """Server-side apply, (its status, its answer); when the server has no route for the
        kind (discovery cached from before its CRD was made again, or a CRD still being
        established), discovery is asked again and the apply retried while the kind is on
        its way (up to ``DISCOVERY_WAIT_SECONDS``): then Unavailable (retried later), or
        InvalidInput when nothing in the cluster would serve the kind."""
        deadline = time.monotonic() + DISCOVERY_WAIT_SECONDS
        delay = 0.1
        while True:
            try:
                return self._server_side_apply(
                    client, api, ref, resource, options, desired, dry_run=False
                )
            except KindNotServed as exc:
                if time.monotonic() >= deadline:
                    raise Unavailable(
                        f"{exc} (discovery lists kind {ref.kind} but the API server does not "
                        f"serve it yet {DISCOVERY_WAIT_SECONDS:g}s later: is its "
                        "CustomResourceDefinition being established?)",
                        resource_id=resource.id,
                    ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            client.forget(ref.api_version)
            api = self.kube.served_api(client, resource, ref)

    @staticmethod
    def _refuse_terminating(resource: ResourceRequest, ref: ObjectRef, obj: JSON) -> None:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise Unavailable(
                f"{resource.id}: {ref.describe()} is being deleted; applying once it is gone",
                resource_id=resource.id,
            )

    def _server_side_apply(
        self,
        client: KubeClient,
        api: ApiResource,
        ref: ObjectRef,
        resource: ResourceRequest,
        options: RuntimeOptions,
        desired: JSON,
        *,
        dry_run: bool,
    ) -> tuple[int, JSON]:
        force = options.force or bool(resource.extensions.get("force"))
        path = api.path(ref.namespace, ref.name)
        doing = f"{'dry-run ' if dry_run else ''}apply of {ref.describe()}"

        def patch(force: bool) -> tuple[int, JSON]:
            query = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
            if dry_run:
                query["dryRun"] = "All"
            return client.exchange(
                "PATCH", path, query=query, body=desired, content_type=APPLY_PATCH
            )

        try:
            return patch(force)
        except ApiError as exc:
            if dry_run and namespace_missing(exc):
                self.kube.namespace_absent(client, ref.namespace, seen_absent=True)
            if exc.status == 404 and not namespace_missing(exc):
                # an apply creates what is missing: a 404 not about the namespace means the
                # server has no route for the kind (404 page not found)
                raise KindNotServed(
                    f"{resource.id}: {doing}: {one_line(exc.message)}", resource_id=resource.id
                ) from None
            if exc.status != 409 or force:
                raise failure(exc, resource.id, doing, resource) from None
            fields, managers = conflict_fields(exc.causes, exc.message)
            if not drift_repair(fields, desired, resource.prior_state):
                who = ", ".join(managers) or "another field manager"
                raise Conflict(
                    f"{resource.id}: {ref.describe()}: field(s) {', '.join(fields) or '?'} "
                    f"are managed by {who}; apply with force (run option or extensions.force: "
                    f"true) to take them over. Server: {exc.message}",
                    resource_id=resource.id,
                ) from None
        try:  # drift repair: take back fields stackflow applied before
            return patch(True)
        except ApiError as exc:
            raise failure(exc, resource.id, doing, resource) from None

    # ---- delete --------------------------------------------------------------------------
    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        await self._delete(resource, options)
        ref = object_ref(resource)
        if is_crd(ref.api_version, ref.kind):
            # its kind is gone: the next apply of it must not trust what discovery said
            client = await self.kube.call(resource.id, self.kube.client_for, resource, options)
            group = (resource.attributes.get("spec") or {}).get("group")
            if isinstance(group, str):
                client.forget_group(group)

    async def _delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        started = await self.kube.call(resource.id, self._start_delete, resource, options)
        if started is None:
            return
        client, api, ref, uid = started
        deadline = time.monotonic() + options.timeout_seconds
        delay = 0.1
        while True:
            live = await self.kube.call(resource.id, self.kube.get, client, api, ref, resource.id)
            if live is None or (live.get("metadata") or {}).get("uid") != uid:
                return
            if time.monotonic() >= deadline:
                finalizers = (live.get("metadata") or {}).get("finalizers") or []
                raise NotReady(
                    f"{resource.id}: {ref.describe()} still exists {options.timeout_seconds:g}s "
                    f"after deletion (finalizers: {', '.join(finalizers) or 'none'})",
                    resource_id=resource.id,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)  # a Namespace takes ~5 s: found gone within 0.5 s

    def _start_delete(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> tuple[KubeClient, ApiResource, ObjectRef, str] | None:
        client = self.kube.client_for(resource, options)
        ref = object_ref(resource)
        api = self.kube.api(client, resource, ref)
        if api is None:
            return None  # its kind is gone (CRD deleted), and with it every object
        explicit = resource.extensions.get("deletionPropagation")
        propagation = explicit or default_propagation(ref)
        if not explicit and self.kube.namespace_goes(client, ref.namespace):
            # the run deletes its namespace after it and waits until that is gone, which it is
            # only once everything in it is, dependents too (an owner's are in its namespace)
            propagation = "Background"
        if propagation not in ("Foreground", "Background", "Orphan"):
            raise InvalidInput(
                f"{resource.id}: extensions.deletionPropagation {propagation!r}: use "
                "Foreground, Background or Orphan",
                resource_id=resource.id,
            )
        seen = self.kube.previewed(client, api, ref)
        if seen is not None:
            # as this run's preview read it: deleted only if it is still exactly that object
            # (uid and resourceVersion) and this stack's; else read again below, and every
            # refusal comes from that fresh read
            try:
                check_owner(resource, ref, seen, options, deleting=True)
                return self._send_delete(client, api, ref, resource, seen, propagation, exact=True)
            except (ObjectChanged, Conflict):
                pass
        live = self.kube.get(client, api, ref, resource.id)
        if live is None:
            return None
        check_owner(resource, ref, live, options, deleting=True)
        try:
            return self._send_delete(client, api, ref, resource, live, propagation, exact=False)
        except ObjectChanged:  # replaced since it was read: not the object this stack deletes
            return None

    @staticmethod
    def _send_delete(
        client: KubeClient,
        api: ApiResource,
        ref: ObjectRef,
        resource: ResourceRequest,
        live: JSON,
        propagation: str,
        *,
        exact: bool,
    ) -> tuple[KubeClient, ApiResource, ObjectRef, str] | None:
        """DELETE on the condition that it is ``live`` (its uid; ``exact``: and its
        resourceVersion): what to wait on, or None when it is gone at once; :class:`ObjectChanged`
        when the condition failed."""
        metadata = live.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        preconditions = {"uid": uid}
        if exact:
            preconditions["resourceVersion"] = str(metadata.get("resourceVersion") or "")
        body: JSON = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
            "preconditions": preconditions,
        }
        try:
            answer = client.request("DELETE", api.path(ref.namespace, ref.name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:  # a precondition failed: it changed or was replaced meanwhile
                raise ObjectChanged from None
            raise failure(exc, resource.id, f"deleting {ref.describe()}", resource) from None
        if deleted_at_once(answer, uid):
            return None
        return client, api, ref, uid

    # ---- readiness -----------------------------------------------------------------------
    @staticmethod
    def _readiness_timeout(resource: ResourceRequest) -> float | None:
        """``extensions.readinessTimeout`` in seconds, None when not given."""
        try:
            return parse_timeout(resource.extensions.get("readinessTimeout"))
        except ValueError as exc:
            raise InvalidInput(
                f"{resource.id}: extensions.{exc}", resource_id=resource.id
            ) from None

    async def wait_ready(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        timeout = self._readiness_timeout(resource) or options.timeout_seconds
        client = await self.kube.call(resource.id, self.kube.client_for, resource, options)
        ref = object_ref(resource)
        api = await self.kube.call(resource.id, self.kube.api, client, resource, ref)
        if api is None:
            raise NotFound(f"{resource.id}: kind {ref.kind} is not served", resource_id=resource.id)
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            live = await self.kube.call(resource.id, self.kube.get, client, api, ref, resource.id)
            if live is None:
                raise NotFound(
                    f"{resource.id}: {ref.describe()} does not exist", resource_id=resource.id
                )
            state = readiness(live)
            if state.ready:
                return normalise(live)
            if state.failed:
                raise NotReady(
                    f"{resource.id}: {ref.describe()}: {state.message}", resource_id=resource.id
                )
            if time.monotonic() >= deadline:
                raise NotReady(
                    f"{resource.id}: {ref.describe()} not ready after {timeout:g}s: "
                    f"{state.message}",
                    resource_id=resource.id,
                )
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 2.0)

    async def close(self) -> None:
        self.kube.close()
