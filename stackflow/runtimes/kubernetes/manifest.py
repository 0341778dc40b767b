"""Pure manifest handling: Kusion ids, the desired object, normalisation, ownership, paths.

Nothing here does I/O, so all of it is unit-testable without a cluster.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stackflow.core.paths import format_path
from stackflow.core.refs import StackRef
from stackflow.runtimes.base import (
    Conflict,
    InvalidInput,
    OwnedElsewhere,
    ResourceRequest,
    RuntimeOptions,
)

JSON = dict[str, Any]

FIELD_MANAGER = "stackflow"
ANNOTATION_PROJECT = "stackflow.io/project"
ANNOTATION_WORKSPACE = "stackflow.io/workspace"
LABEL_PROJECT = "stackflow.io/project"
LABEL_WORKSPACE = "stackflow.io/workspace"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "stackflow"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SERVER_METADATA = (
    "managedFields",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str | None
    name: str

    @property
    def kusion_id(self) -> str:
        parts = [self.api_version, self.kind, self.namespace, self.name]
        return ":".join(p for p in parts if p)

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def object_ref(resource: ResourceRequest) -> ObjectRef:
    """apiVersion, kind, namespace and name of the manifest, checked for shape."""
    attrs = resource.attributes
    rid = resource.id

    def text(value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise InvalidInput(
                f"{rid}: attributes.{where} must be a non-empty string", resource_id=rid
            )
        return value

    metadata = attrs.get("metadata")
    if not isinstance(metadata, Mapping):
        raise InvalidInput(
            f"{rid}: attributes.metadata must be an object with a name", resource_id=rid
        )
    namespace = metadata.get("namespace")
    if namespace is not None:
        namespace = text(namespace, "metadata.namespace")
    return ObjectRef(
        text(attrs.get("apiVersion"), "apiVersion"),
        text(attrs.get("kind"), "kind"),
        namespace,
        text(metadata.get("name"), "metadata.name"),
    )


def check_id(resource: ResourceRequest, ref: ObjectRef, namespaced: bool | None) -> None:
    """The Kusion id must name the manifest: ``apiVersion:Kind[:namespace]:name``.

    ``namespaced`` comes from discovery; None when the kind is not served yet (a CRD made
    earlier in the same run), then only the id and the manifest are compared.
    """
    rid = resource.id
    if namespaced is True and ref.namespace is None:
        raise InvalidInput(
            f"{rid}: {ref.kind} is namespaced: set attributes.metadata.namespace", resource_id=rid
        )
    if namespaced is False and ref.namespace is not None:
        raise InvalidInput(
            f"{rid}: {ref.kind} is cluster-scoped: remove attributes.metadata.namespace "
            f"({ref.namespace!r})",
            resource_id=rid,
        )
    if rid != ref.kusion_id:
        raise InvalidInput(
            f"{rid}: the id does not match the manifest, which is {ref.kusion_id!r} "
            "(apiVersion:Kind:namespace:name, or apiVersion:Kind:name when cluster-scoped)",
            resource_id=rid,
        )


def owner_of(live: Mapping[str, Any]) -> StackRef | None:
    """The stack the object's ownership annotations name, if any."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    project = annotations.get(ANNOTATION_PROJECT)
    if not project:
        return None
    return StackRef(str(project), str(annotations.get(ANNOTATION_WORKSPACE) or ""))


def desired_object(resource: ResourceRequest, options: RuntimeOptions) -> JSON:
    """The manifest stackflow applies: the spec's, plus the ownership markers.

    A Secret's ``stringData`` is folded into ``data`` (base64), as the API server would: the
    object then converges to exactly what is applied and no write-only field lingers.
    ``status`` is never applied (the server ignores it for kinds with a status subresource).
    """
    obj = copy.deepcopy(dict(resource.attributes))
    obj.pop("status", None)
    if obj.get("kind") == "Secret" and obj.get("apiVersion") == "v1" and "stringData" in obj:
        string_data = obj.pop("stringData") or {}
        if not isinstance(string_data, Mapping):
            raise InvalidInput(
                f"{resource.id}: attributes.stringData must be a map", resource_id=resource.id
            )
        data = dict(obj.get("data") or {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode("utf-8")).decode("ascii")
        obj["data"] = data
    metadata = obj.setdefault("metadata", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    labels = {**labels, LABEL_MANAGED_BY: MANAGED_BY}
    for key, value in ((LABEL_PROJECT, options.project), (LABEL_WORKSPACE, options.workspace)):
        if len(value) <= 63 and _LABEL_VALUE.match(value):
            labels[key] = value
    annotations = {
        **annotations,
        ANNOTATION_PROJECT: options.project,
        ANNOTATION_WORKSPACE: options.workspace,
    }
    metadata["labels"] = labels
    metadata["annotations"] = annotations
    return obj


def normalise(obj: Mapping[str, Any]) -> JSON:
    """A live object without what the server writes for itself (status, bookkeeping).

    A new top-level map and ``metadata``; the values below them are ``obj``'s own, not
    copies: every object passed here is one the caller just decoded from an answer of the
    server (or a listing) and owns alone."""
    out = {k: v for k, v in obj.items() if k != "status"}
    metadata = dict(out.get("metadata") or {})
    for key in _SERVER_METADATA:
        metadata.pop(key, None)
    out["metadata"] = metadata
    return out


def removed_paths(before: Any, after: Any, at: tuple[str | int, ...] = ()) -> list[str]:
    """The fields of ``before`` that ``after`` no longer holds (map keys; list items of lists
    of one length, position by position: a list that grew or shrank shows as a change of the
    list itself)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out = []
        for key, value in before.items():
            if key not in after:
                out.append(format_path((*at, key)))
            else:
                out += removed_paths(value, after[key], (*at, key))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            p
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for p in removed_paths(b, a, (*at, i))
        ]
    return []


def previewed(
    desired: JSON, live: Mapping[str, Any] | None, result: Mapping[str, Any]
) -> tuple[JSON, list[str]] | None:
    """What a preview shows of a dry-run apply's answer ``result`` (would-be object, removed
    paths), or None when ``live`` is not the object the dry run merged onto (another
    ``resourceVersion``: it changed since it was read). Without ``live`` (a create), the
    fields ``desired`` sets."""
    after = normalise(result)
    if live is None:
        return shaped_like(after, desired), []
    if _version(live) != _version(result):
        return None
    before = normalise(live)
    return shaped_like(after, preview_shape(desired, before, after)), removed_paths(before, after)


def _version(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


def preview_shape(desired: Any, before: Any, after: Any) -> Any:
    """The shape (for :func:`shaped_like`) of what a preview shows of the apply's answer
    ``after``: the fields ``desired`` sets, plus every field the apply gives another value
    than ``before`` (the live object) holds, or adds (a field the spec no longer sets going
    back to its default, a port the server allocates), as kubectl diff shows them."""
    return _union(desired, _changed(before, after))


def _changed(before: Any, after: Any) -> Any:
    """The fields of ``after`` that ``before`` lacks or holds another value of (whole values
    below a map key), None when there are none."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out = {}
        for key, value in after.items():
            if key not in before:
                out[key] = value
            elif before[key] != value:
                inner = _changed(before[key], value)
                out[key] = value if inner is None else inner
        return out or None
    return None if before == after else after


def _union(a: Any, b: Any) -> Any:
    """Two shapes as one: the map keys of both, lists item by item."""
    if b is None:
        return a
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {**b, **{k: _union(v, b.get(k)) for k, v in a.items()}}
    if isinstance(a, list) and isinstance(b, list):
        both = [_union(x, y) for x, y in zip(a, b, strict=False)]
        return both + a[len(b) :] + b[len(a) :]
    return b if isinstance(b, Mapping | list) else a


def shaped_like(value: Any, shape: Any) -> Any:
    """``value`` reduced to the map keys present in ``shape``, recursively.

    List items are matched by position (the server keeps the applied order); items beyond
    ``shape`` are kept whole (another manager's entries of a list stackflow also sets).
    """
    if isinstance(value, Mapping) and isinstance(shape, Mapping):
        return {k: shaped_like(value[k], s) for k, s in shape.items() if k in value}
    if isinstance(value, list) and isinstance(shape, list):
        n = len(shape)
        return [shaped_like(v, shape[i]) if i < n else v for i, v in enumerate(value)]
    return copy.deepcopy(value)


def check_owner(
    resource: ResourceRequest,
    ref: ObjectRef,
    live: Mapping[str, Any],
    options: RuntimeOptions,
    *,
    deleting: bool = False,
) -> None:
    """Refuse to touch an object another stack owns, or an unowned one not adopted."""
    owner = owner_of(live)
    this = options.stack
    rid = resource.id
    if owner is not None and owner != this:
        action = "delete" if deleting else "apply"
        raise OwnedElsewhere(
            f"{rid}: {ref.describe()} belongs to stackflow stack {owner} "
            f"(annotations {ANNOTATION_PROJECT}, {ANNOTATION_WORKSPACE}); refusing to {action} it "
            f"from {this}: remove it from that stack first",
            resource_id=rid,
        )
    if owner is None and not deleting and resource.prior_state is None:
        adopt = options.adopt or bool(resource.extensions.get("adopt"))
        if not adopt:
            raise Conflict(
                f"{rid}: {ref.describe()} already exists and is not managed by stackflow; "
                "to take it over, set extensions.adopt: true on the resource (or run with "
                "adopt), or delete it first",
                resource_id=rid,
            )


# ---- field paths of server-side-apply conflicts ---------------------------------------------
# The server names conflicting fields in structured-merge-diff's path syntax:
#   .spec.replicas   .spec.template.spec.containers[name="app"].image   .spec.list[0]   [="v"]
_SEGMENT = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")
MISSING: Any = object()


def _parse_key(body: str) -> Any:
    """The inside of ``[...]``: an index, a set value ``=v``, or ``k=v,k2=v2`` keys."""
    if body.isdigit():
        return int(body)
    if body.startswith("="):
        return ("value", json.loads(body[1:]))
    keys: dict[str, Any] = {}
    decoder = json.JSONDecoder()
    rest = body
    while rest:
        name, sep, rest = rest.partition("=")
        if not sep:
            raise ValueError(body)
        value, end = decoder.raw_decode(rest)
        keys[name] = value
        rest = rest[end:].lstrip(",")
    return ("keys", keys)


def lookup(obj: Any, path: str) -> Any:
    """The value at a server field path, or MISSING (also for paths that cannot be read)."""
    pos = 0
    current = obj
    try:
        while pos < len(path):
            match = _SEGMENT.match(path, pos)
            if match is None:
                return MISSING
            pos = match.end()
            if match.group(1) is not None:
                if not isinstance(current, Mapping) or match.group(1) not in current:
                    return MISSING
                current = current[match.group(1)]
                continue
            key = _parse_key(match.group(2))
            if not isinstance(current, list):
                return MISSING
            if isinstance(key, int):
                if key >= len(current):
                    return MISSING
                current = current[key]
            elif key[0] == "value":
                if key[1] not in current:
                    return MISSING
                current = key[1]
            else:
                wanted = key[1]
                items = [
                    item
                    for item in current
                    if isinstance(item, Mapping)
                    and all(item.get(k) == v for k, v in wanted.items())
                ]
                if len(items) != 1:
                    return MISSING
                current = items[0]
    except ValueError:
        return MISSING
    return current


_CONFLICT_MANAGER = re.compile(r'conflict with "([^"]+)"(?: with subresource "([^"]+)")?')


def conflict_fields(causes: list[JSON], message: str) -> tuple[list[str], list[str]]:
    """(fields, managers) of a server-side-apply conflict (from the Status causes)."""
    fields: list[str] = []
    managers: list[str] = []
    for cause in causes:
        if cause.get("type") not in (None, "FieldManagerConflict"):
            continue
        if cause.get("field"):
            fields.append(str(cause["field"]))
        for match in _CONFLICT_MANAGER.finditer(str(cause.get("message", ""))):
            name = match.group(1) + (f" (subresource {match.group(2)})" if match.group(2) else "")
            if name not in managers:
                managers.append(name)
    if not managers:
        managers = sorted({m.group(1) for m in _CONFLICT_MANAGER.finditer(message)})
    return sorted(set(fields)), managers


def drift_repair(
    fields: list[str], desired: Mapping[str, Any], prior: Mapping[str, Any] | None
) -> bool:
    """True when every conflicting field is one stackflow applied before, unchanged since.

    That is drift: the last release recorded the field with the value the spec still asks
    for, so another manager moved it away behind stackflow's back and stackflow takes it
    back. A field the spec newly sets or changes while someone else manages it is a real
    conflict of intent and is left to the user (``force``).
    """
    if prior is None or not fields:
        return False
    for path in fields:
        want = lookup(desired, path)
        if want is MISSING or want != lookup(prior, path):
            return False
    return True
