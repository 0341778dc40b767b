"""The document policies read: the masked plan.

``{stack, operation, changes: [{id, type, action, before, after, diff, drift, extensions}],
summary, requested_by, source, time}``: every resource of the plan (unchanged ones too, so a
policy can hold every object to a rule), ``before`` its recorded attributes, ``after`` the
spec's (None when deleted), ``diff`` what the preview found, field by field, ``extensions``
the spec's (or the recorded resource's) ``provider`` and ``resourceType`` (what a Terraform
resource is installed from: a provider allowlist reads it, not the id). Provider settings
(``providerMeta``) are left out: they may carry credentials. Every sensitive value
(a type's secret fields, what was recorded sensitive, what a ``$kusion_path`` reference
takes from one) is masked here exactly as in ``release show``; ``time`` is the run's clock
(the workflow's, so a replay judges the same input)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from stackflow.engine.masking import (
    RECORDED_SENSITIVE_KEY,
    mask_attributes,
    mask_recorded,
    release_sensitive_paths,
)
from stackflow.model.source import SourceRef
from stackflow.model.spec import Resource, Spec

INPUT_KIND = "policy_input"
EXTENSION_KEYS = ("provider", "resourceType")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _masked(resource: Resource, sensitive: Mapping[str, set[str]]) -> dict[str, Any]:
    attrs = mask_attributes(str(resource.type), resource.attributes)
    paths = sensitive.get(resource.id)
    attrs = mask_recorded(attrs, paths) if paths else attrs
    attrs.pop(RECORDED_SENSITIVE_KEY, None)
    return attrs


def build_input(
    *,
    project: str,
    workspace: str,
    operation: str,
    spec: Spec | None,
    node_ids: list[str],
    deletion_ids: list[str],
    types: Mapping[str, str],
    recorded: Mapping[str, Resource],
    changes: list[dict[str, Any]],
    requested_by: str,
    source: SourceRef | None,
    now: str,
) -> dict[str, Any]:
    """The input document (see the module); ``changes`` are the preview's (id, action,
    drift, diff), resources it does not name are unchanged."""
    found = {str(c.get("id")): c for c in changes}
    desired = {r.id: r for r in spec.resources} if spec is not None else {}
    sensitive = release_sensitive_paths(spec, recorded.values())
    out: list[dict[str, Any]] = []
    summary: dict[str, int] = {}

    def add(resource_id: str, deleting: bool) -> None:
        change = found.get(resource_id, {})
        action = str(change.get("action") or ("Delete" if deleting else "UnChanged"))
        before = recorded.get(resource_id)
        after = None if deleting else desired.get(resource_id)
        summary[action] = summary.get(action, 0) + 1
        source_of = after if after is not None else before
        extensions = (
            {k: source_of.extensions[k] for k in EXTENSION_KEYS if k in source_of.extensions}
            if source_of is not None
            else {}
        )
        out.append(
            {
                "id": resource_id,
                "type": types.get(resource_id, ""),
                "action": action,
                "drift": bool(change.get("drift", False)),
                "before": _masked(before, sensitive) if before is not None else None,
                "after": _masked(after, sensitive) if after is not None else None,
                "diff": [
                    {"path": d.get("path"), "old": d.get("old"), "new": d.get("new")}
                    for d in change.get("diff") or []
                ],
                "extensions": extensions,
            }
        )

    for resource_id in node_ids:
        add(resource_id, False)
    for resource_id in deletion_ids:
        add(resource_id, True)
    at = datetime.fromisoformat(now).astimezone(UTC)
    seconds = (at - EPOCH) // timedelta(seconds=1)
    return {
        "stack": {"project": project, "workspace": workspace},
        "operation": operation,
        "changes": out,
        "summary": summary,
        "requested_by": requested_by,
        "source": source.model_dump(mode="json") if source is not None else None,
        "time": {
            "rfc3339": at.isoformat(),
            "unix_ns": seconds * 1_000_000_000 + at.microsecond * 1000,
            "weekday": _WEEKDAYS[at.weekday()],
            "hour": at.hour,
        },
    }


def input_bytes(document: dict[str, Any]) -> bytes:
    """The document as stored and evaluated (its sha256 is the decision's input digest)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), default=str).encode()
