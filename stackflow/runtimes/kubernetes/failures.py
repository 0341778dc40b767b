"""The Kubernetes runtime's failures: the API server's answers mapped onto the typed errors
of :mod:`stackflow.runtimes.base` (see the runtime's docstring), and the deletion rules that
depend on what the server answered."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from stackflow.engine.masking import mask_text, sensitive_paths_for
from stackflow.runtimes.base import (
    Conflict,
    Denied,
    InvalidInput,
    NotFound,
    ResourceRequest,
    RuntimeFailure,
    Unavailable,
)
from stackflow.runtimes.kubernetes.client import (
    JSON,
    ApiError,
)
from stackflow.runtimes.kubernetes.manifest import (
    ObjectRef,
)

DISCOVERY_WAIT_SECONDS = 15.0
"""How long apply waits for a kind to be served (a CRD just created is being established)."""


class ObjectChanged(Exception):
    """A conditional DELETE's precondition failed: the object changed or was replaced."""


class NotReady(RuntimeFailure):
    """The object did not become ready (or go away) in time, or failed for good."""

    kind = "NotReady"


class KindNotServed(NotFound):
    """A request for an object found no route for its kind (a 404 that is not about the
    object or its namespace): the kind is not served, or not yet (its CRD is being
    established, or discovery was cached from before its CRD was deleted and made again)."""


def namespace_missing(exc: ApiError) -> bool:
    """Whether a 404 says the object's namespace does not exist."""
    return exc.status == 404 and exc.details.get("kind") == "namespaces"


def unserved_error(rid: str, ref: ObjectRef, reason: str, soon: bool | None) -> RuntimeFailure:
    """Why ``ref``'s kind is not served, once waiting for it is over: ``soon`` (its CRD or
    APIService exists and is being established) -> Unavailable, retried; else InvalidInput
    naming the kind (``reason`` says whether a CustomResourceDefinition defines it)."""
    text = f"{rid}: the API server does not serve kind {ref.kind} in apiVersion {ref.api_version}"
    if soon:
        return Unavailable(f"{text}: {reason} after {DISCOVERY_WAIT_SECONDS:g}s", resource_id=rid)
    if not reason:
        group = ref.api_version.rpartition("/")[0]
        reason = (
            f"is a CustomResourceDefinition of kind {ref.kind} in group {group} applied and "
            "established? (the cluster did not let stackflow look)"
            if "." in group
            else "is the apiVersion right?"
        )
    return InvalidInput(f"{text}: {reason}", resource_id=rid)


_TYPED = re.compile(
    r"failed to create typed (patch|live) object(?:\s*\([^()]*\))?:\s*(?:errors:)?\s*(.*)", re.S
)
_GO_POINTER = re.compile(r"got &\{(.*)\}$")


def one_line(text: str) -> str:
    return " ".join(text.split())


def _typed_errors(text: str) -> str:
    """structured-merge-diff's errors (one per line) as ``path: problem; path: problem``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(_GO_POINTER.sub(r"got \1", line) for line in lines)


# ---- admission denials ----------------------------------------------------------------------
DENIAL_MESSAGE_LIMIT = 400
"""Characters of a policy's own message a denial quotes (then ``…``), as Terraform's errors."""
NAME_LIMIT = 253
"""Characters of a policy, binding or webhook name quoted (a DNS subdomain's at most)."""

# What ``admission.NewForbidden`` puts before a ValidatingAdmissionPolicy's denial: the
# group-qualified resource and, when known, the object's Go-quoted name.
_FORBIDDEN_PREFIX = re.compile(r'\S+(?: "(?:[^"\\]|\\.)*")? is forbidden: ')
_VAP = re.compile(
    r"ValidatingAdmissionPolicy '(?P<policy>[^']*)'(?: with binding '(?P<binding>[^']*)')?"
    r" denied request: (?P<message>.*)",
    re.S,
)
_WEBHOOK = re.compile(
    r'admission webhook "(?P<policy>(?:[^"\\]|\\.)*)" denied the request'
    r"(?:: (?P<message>.*)| without explanation)",
    re.S,
)
_GO_ESCAPE = re.compile(r"\\(.)")
_CONTROLS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


@dataclass(frozen=True)
class AdmissionDenial:
    """An API server's admission refusing an object: which policy, and its words."""

    kind: Literal["ValidatingAdmissionPolicy", "AdmissionWebhook"]
    policy: str
    """The ValidatingAdmissionPolicy's name, or the webhook's (as its configuration names it)."""
    binding: str | None
    """The ValidatingAdmissionPolicyBinding that applied the policy (None for a webhook)."""
    message: str
    """The policy's message as the server gave it ("" when a webhook gave none)."""

    def describe(self, rid: str, resource: ResourceRequest | None = None) -> str:
        """One line naming ``rid`` and the policy; every sensitive value of ``resource`` (a
        Secret's ``data`` and ``stringData``, values taken from sensitive ones) masked,
        control characters stripped, the policy's message capped."""
        message = self.message
        if resource is not None:
            paths = [
                *sensitive_paths_for(resource.type, resource.attributes),
                *resource.sensitive_paths,
            ]
            message = mask_text(message, resource.attributes, paths)
        message = _clean(message, DENIAL_MESSAGE_LIMIT)
        policy = _clean(self.policy, NAME_LIMIT)
        if self.kind == "AdmissionWebhook":
            said = f": {message}" if message else " without explanation"
            return f"{rid}: denied by Kubernetes admission webhook '{policy}'{said}"
        binding = ""
        if self.binding is not None:
            binding = f" (binding '{_clean(self.binding, NAME_LIMIT)}')"
        by = f"Kubernetes ValidatingAdmissionPolicy '{policy}'{binding}"
        return f"{rid}: denied by {by}: {message}"


def _clean(text: str, limit: int) -> str:
    """One line: whitespace runs made one space, other control (and bidi) characters
    dropped, at most ``limit`` characters."""
    text = _CONTROLS.sub("", " ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def admission_denial(exc: ApiError) -> AdmissionDenial | None:
    """The admission denial ``exc`` reports, or None when it is no such thing.

    A ValidatingAdmissionPolicy's denial (``<resource> "<name>" is forbidden:
    ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``)
    comes with the status of the validation's ``reason``: 422 Invalid by default, 403
    Forbidden, 401 or 413. A validating (or mutating) webhook's (``admission webhook
    "<name>" denied the request: <message>``, or ``... denied the request without
    explanation``) with the code the webhook chose, 400 unless it chose one. 408, 429 and
    5xx are left alone: a webhook saying "try later" is retried as any such answer."""
    status = exc.status
    if status < 400 or status >= 500 or status in (408, 429):
        return None
    text = exc.message.strip()
    webhook = _WEBHOOK.fullmatch(text)
    if webhook is not None:
        name = _GO_ESCAPE.sub(r"\1", webhook["policy"])
        return AdmissionDenial("AdmissionWebhook", name, None, webhook["message"] or "")
    prefix = _FORBIDDEN_PREFIX.match(text)
    vap = _VAP.fullmatch(text, prefix.end() if prefix is not None else 0)
    if vap is None:
        return None
    return AdmissionDenial(
        "ValidatingAdmissionPolicy", vap["policy"], vap["binding"], vap["message"]
    )


def failure(
    exc: ApiError, rid: str, doing: str, resource: ResourceRequest | None = None
) -> RuntimeFailure:
    """The runtime error for a failure status of the API server (one line, naming ``rid``).

    An admission denial is :class:`Denied` naming the policy, with ``resource``'s sensitive
    values masked (:meth:`AdmissionDenial.describe`)."""
    denial = admission_denial(exc)
    if denial is not None:
        return Denied(denial.describe(rid, resource), resource_id=rid)
    status, message = exc.status, one_line(exc.message)
    server = f"Kubernetes API {exc.server}" if exc.server else "the Kubernetes API"
    typed = _TYPED.search(exc.message) if status == 500 else None
    if typed is not None and typed.group(1) == "patch":
        # server-side apply could not read the manifest against the schema: a value of the
        # wrong type, a field the kind does not have. Older servers say so with a 500.
        return InvalidInput(f"{rid}: {_typed_errors(typed.group(2))}", resource_id=rid)
    if typed is not None:
        return InvalidInput(
            f"{rid}: {doing}: the live object does not match its schema (fix or replace it; "
            f"retrying will not help): {_typed_errors(typed.group(2))}",
            resource_id=rid,
        )
    if status == 422 or exc.reason == "Invalid":
        fields = list(dict.fromkeys(str(c["field"]) for c in exc.causes if c.get("field")))
        named = f", invalid {', '.join(fields)}" if fields else ""
        return InvalidInput(
            f"{rid}: {doing} rejected by the API server{named}: {message}", resource_id=rid
        )
    if status == 400:
        return InvalidInput(
            f"{rid}: {doing} rejected by the API server: {message}", resource_id=rid
        )
    text = f"{rid}: {doing}: {message}"
    if status == 401:
        return InvalidInput(
            f"{text} ({server} does not accept the kubeconfig's credentials; retrying will not "
            "help: fix or renew them)",
            resource_id=rid,
        )
    if status == 403:
        if "being terminated" in message:
            return Unavailable(text, resource_id=rid)
        return InvalidInput(
            f"{text} (the kubeconfig's user lacks RBAC permission; retrying will not help: "
            "grant it, or use another kubeconfig or context)",
            resource_id=rid,
        )
    if status == 404:
        return NotFound(text, resource_id=rid)
    if status == 409:
        return Conflict(text, resource_id=rid)
    if status in (408, 410, 429) or status >= 500:
        answered = f"{status} {exc.reason}".strip()
        return Unavailable(
            f"{rid}: {doing}: {server} answered {answered}: {message}", resource_id=rid
        )
    return InvalidInput(text, resource_id=rid)


LEAF_KINDS = frozenset(
    {
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
        ("v1", "Namespace"),
        ("v1", "LimitRange"),
        ("v1", "ResourceQuota"),
        ("v1", "PersistentVolumeClaim"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("networking.k8s.io/v1", "Ingress"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("policy/v1", "PodDisruptionBudget"),
        ("scheduling.k8s.io/v1", "PriorityClass"),
        ("storage.k8s.io/v1", "StorageClass"),
    }
)
"""Built-in kinds no controller makes dependents of: foreground deletion would only add a
round through the garbage collector (a Namespace's contents go by its own finalizer)."""

BUILT_IN_GROUPS = frozenset({"", "apps", "batch", "autoscaling", "policy"})
"""API groups of Kubernetes' own kinds besides ``*.k8s.io`` (``v1`` is the core group)."""


def deleted_at_once(answer: JSON, uid: str) -> bool:
    """Whether a DELETE's answer says the object is already gone: when nothing defers the
    removal (no finalizers, no grace period) the server answers ``Status: Success`` naming
    the removed object's uid; a deferred removal comes back as the object, marked with
    ``deletionTimestamp``, and is waited for."""
    if not uid or answer.get("kind") != "Status" or answer.get("status") != "Success":
        return False
    return bool((answer.get("details") or {}).get("uid") == uid)


def default_propagation(ref: ObjectRef) -> str:
    """Foreground (dependents first) for Kubernetes' own kinds that own others (Deployment,
    Job, ...); Background, as ``kubectl delete`` and Helm do, for the leaf kinds and for
    custom resources: the garbage collector acts on a kind only once its discovery resync
    has found it (every 30 s, never while an aggregated API is unavailable), so a foreground
    deletion of a custom resource whose CRD is new waited 20-100 s for nothing."""
    group = ref.api_version.rpartition("/")[0]
    built_in = group in BUILT_IN_GROUPS or group.endswith(".k8s.io")
    if not built_in or (ref.api_version, ref.kind) in LEAF_KINDS:
        return "Background"
    return "Foreground"
