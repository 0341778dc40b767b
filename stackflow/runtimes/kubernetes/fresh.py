"""New objects in a namespace the same run created: applied without the ownership read.

Nothing by an object's name can predate a namespace the run itself created (its apply was
answered 201 Created), so the first apply of a new object there needs no GET to check whose
it is. That apply must be answered 201 too: a 200 means someone else created the object in
the meantime, and :func:`appeared` withdraws what the apply set and refuses, as the read
would have. Not for adoption, for a forced apply (fields it took over from other managers
would be lost by the withdrawal), for a retried apply (its first attempt may have created
the object), for another run, nor for what the control plane itself puts in every new
namespace (:data:`CLUSTER_MADE`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from stackflow.core.refs import RunRef
from stackflow.runtimes.base import Conflict, ResourceRequest, RuntimeFailure, RuntimeOptions
from stackflow.runtimes.kubernetes.client import (
    APPLY_PATCH,
    ApiError,
    ApiResource,
    KubeClient,
)
from stackflow.runtimes.kubernetes.failures import one_line
from stackflow.runtimes.kubernetes.manifest import FIELD_MANAGER, ObjectRef

HTTP_CREATED = 201
"""What an apply that created its object is answered (200: it was there)."""
CLUSTER_MADE = frozenset(
    {("v1", "ConfigMap", "kube-root-ca.crt"), ("v1", "ServiceAccount", "default")}
)
"""Objects the control plane itself puts in every new namespace."""


class FreshNamespaces:
    """Namespaces a run created on this worker, and the objects it has applied in them
    since. At most ``SIZE`` namespaces are remembered, the oldest forgotten first."""

    SIZE = 256

    def __init__(self) -> None:
        self._made: OrderedDict[tuple[int, str], tuple[RunRef, set[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, client: int, namespace: str, run: RunRef) -> None:
        """``run`` created ``namespace`` (its apply was answered 201 Created)."""
        with self._lock:
            self._made[(client, namespace)] = (run, set())
            self._made.move_to_end((client, namespace))
            while len(self._made) > self.SIZE:
                self._made.popitem(last=False)

    def claim_for(
        self,
        client: KubeClient,
        api: ApiResource,
        ref: ObjectRef,
        resource: ResourceRequest,
        options: RuntimeOptions,
    ) -> bool:
        """Whether ``ref`` is a new object (none recorded) in a namespace this run created
        on this worker, applied here for the first time (it counts as applied from now on):
        then it is applied without the ownership read."""
        if (
            options.owner is None
            or not api.namespaced
            or not ref.namespace
            or resource.prior_state is not None
            or options.adopt
            or resource.extensions.get("adopt")
            or options.force  # a forced apply takes fields over: never withdrawn after it
            or resource.extensions.get("force")
            or (ref.api_version, ref.kind, ref.name) in CLUSTER_MADE
        ):
            return False
        path = api.path(ref.namespace, ref.name)
        with self._lock:
            made = self._made.get((id(client), ref.namespace))
            if made is None or made[0] != options.owner or path in made[1]:
                return False
            made[1].add(path)
            return True


def appeared(
    client: KubeClient, api: ApiResource, ref: ObjectRef, resource: ResourceRequest
) -> None:
    """The apply of an object in a namespace this run created found it there already
    (answered 200, not 201): someone else created it meanwhile. Withdraw what the apply set
    (an apply of no fields by the same field manager gives up every field it owned: the
    ones only it set are removed, the others stay as their managers set them) and refuse,
    as the ownership read would have."""
    bare = {
        "apiVersion": ref.api_version,
        "kind": ref.kind,
        "metadata": {"name": ref.name, "namespace": ref.namespace},
    }
    query = {"fieldManager": FIELD_MANAGER, "force": "false"}
    path = api.path(ref.namespace, ref.name)
    try:
        client.request("PATCH", path, query=query, body=bare, content_type=APPLY_PATCH)
        withdrawn = "stackflow withdrew the fields it applied"
    except ApiError as exc:
        withdrawn = f"withdrawing the fields stackflow applied failed: {one_line(exc.message)}"
    except RuntimeFailure as exc:  # no answer: still a Conflict, never retried into adoption
        withdrawn = f"withdrawing the fields stackflow applied failed: {one_line(str(exc))}"
    raise Conflict(
        f"{resource.id}: {ref.describe()} appeared in namespace {ref.namespace}, which this "
        f"run created, before stackflow applied it (someone else created it); {withdrawn}. "
        "To take it over, set extensions.adopt: true on the resource (or run with adopt), "
        "or delete it first",
        resource_id=resource.id,
    )
