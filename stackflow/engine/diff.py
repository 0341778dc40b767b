"""Field diffs, and the three-way diff of a preview: desired (spec or runtime's would-be
object) vs live vs prior.

The one owner of comparing values (:func:`leaf_changes`, on deepdiff) and of a preview's
change (:class:`Change`, :class:`FieldChange`); the release diff
(:mod:`stackflow.engine.release_diff`)
builds on the same field diff and field change. What is sensitive and how it is masked is
:mod:`stackflow.engine.masking`'s: a preview's change is masked as it is made.

Only the fields the spec manages are compared: live is projected onto the shape of desired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field, model_validator

from stackflow.core.paths import (
    PathError,
    Segment,
    format_path,
    get_path,
    leaves,
    matches_prefix,
    parse_path,
)
from stackflow.engine.masking import masked_value


class Action(StrEnum):
    Create = "Create"
    Update = "Update"
    Delete = "Delete"
    UnChanged = "UnChanged"


class FieldChange(BaseModel):
    """One field that differs: ``old``/``new`` are None where the field is absent, and the
    masking marker where it is sensitive."""

    path: str
    old: Any = None
    new: Any = None


class Change(BaseModel):
    """What a preview, a refresh or a drift check found for one resource. On the wire (in
    history, in the backend's diff blobs, in ``--output json``) it is this model's JSON;
    :func:`stackflow.engine.budget.compact_change` is its form within the byte budget."""

    id: str
    type: str
    action: Action
    drift: bool = False
    diff: list[FieldChange] = []
    unrecorded: bool = Field(default=False, exclude=True)
    """The resource matches the spec but this stack has not recorded it (apply adopts it):
    a flag of the batch's change code, never in the change's JSON."""


class Preview(BaseModel):
    changes: list[Change] = []
    totals: dict[str, int] | None = Field(default=None, exclude=True)
    """Counts of every line of a run's preview (a run lists only the first ones): read from
    the ``summary`` of a run's view; without it the listed changes are counted."""
    truncated: bool = Field(default=False, exclude=True)
    left_out: dict[str, Any] | None = Field(default=None, exclude=True)
    """What ``--target``/``--exclude`` left out: ``{"count": n, "resources": [{id, reason,
    via}]}`` (the list capped)."""

    @model_validator(mode="before")
    @classmethod
    def _summary_is_totals(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("summary"), dict):
            data = {**data, "totals": data["summary"]}
            data.pop("summary")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> dict[str, int]:
        counts = {action.value: 0 for action in Action}
        if self.totals is not None:
            counts.update({k: int(v) for k, v in self.totals.items() if k in counts})
            return counts
        for change in self.changes:
            counts[change.action.value] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form: ``{"changes": [...], "summary": {...}}``."""
        return {
            "changes": [change.model_dump(mode="json") for change in self.changes],
            "summary": self.summary,
        }

    @property
    def has_changes(self) -> bool:
        return any(c.action is not Action.UnChanged for c in self.changes)


def project(live: Any, desired: Any) -> Any:
    """``live`` reduced to the dict keys present in ``desired``, recursively."""
    if type(desired) is dict and type(live) is dict:  # fast path for JSON-like data
        return {k: project(live[k], v) for k, v in desired.items() if k in live}
    if isinstance(live, Mapping) and isinstance(desired, Mapping):
        return {k: project(live[k], v) for k, v in desired.items() if k in live}
    if isinstance(live, list) and isinstance(desired, list):
        n = len(desired)
        return [project(item, desired[i]) if i < n else item for i, item in enumerate(live)]
    return live


def prune(value: Any, patterns: Sequence[Sequence[Segment]], at: tuple[Segment, ...] = ()) -> Any:
    """A copy of ``value`` without the fields matched by ``patterns``."""
    if not patterns:
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            here = (*at, k)
            if not any(matches_prefix(p, here) for p in patterns):
                out[k] = prune(v, patterns, here)
        return out
    if isinstance(value, list):
        items = []
        for i, v in enumerate(value):
            here = (*at, i)
            if not any(matches_prefix(p, here) for p in patterns):
                items.append(prune(v, patterns, here))
        return items
    return value


class _Absent:
    """A field missing on one side; compares equal only to itself."""


def _value_at(value: Any, path: Sequence[Segment]) -> Any:
    try:
        return get_path(value, path)
    except PathError:
        return _Absent


def leaf_changes(old: Any, new: Any) -> list[tuple[tuple[Segment, ...], Any, Any]]:
    """Leaf-level (path, old, new) differences, via deepdiff; a missing field shows as None."""
    if old == new:  # fast path: most resources are unchanged
        return []
    from deepdiff import DeepDiff  # imported on the first real difference (slow to import)
    from deepdiff.helper import notpresent

    # numbers compare as == does (1 == 1.0), so the fast path and deepdiff agree
    tree = DeepDiff(old, new, view="tree", verbose_level=2, ignore_numeric_type_changes=True)
    out: list[tuple[tuple[Segment, ...], Any, Any]] = []
    for report in tree.values():
        for level in report:
            path = tuple(level.path(output_format="list"))
            if level.t1 is notpresent:
                out.extend((p, None, v) for p, v in leaves(level.t2, path))
            elif level.t2 is notpresent:
                out.extend((p, v, None) for p, v in leaves(level.t1, path))
            else:
                out.append((path, level.t1, level.t2))
    out.sort(key=lambda item: format_path(item[0]))
    return out


def diff_resource(
    resource_id: str,
    resource_type: str,
    desired: Mapping[str, Any] | None,
    live: Mapping[str, Any] | None,
    prior: Mapping[str, Any] | None,
    *,
    ignore_fields: Sequence[str] = (),
    sensitive_paths: Sequence[str] = (),
    removed_paths: Sequence[str] = (),
) -> Change:
    """The change that brings ``live`` to ``desired``, with drift judged against ``prior``.

    - desired None: Delete if the resource is in prior state or still live, else UnChanged.
    - live None: Create (drift if prior says it existed: someone deleted it).
    - otherwise Update if live (projected onto desired) differs from desired, or holds one
      of ``removed_paths`` (fields outside desired the runtime's merge would remove, as the
      runtime's preview reports them: one a spec no longer sets), else UnChanged; drift if a
      differing field was not changed by the spec since prior (a removal is the spec's).
    """
    ignore = [parse_path(p) for p in ignore_fields]
    secret = [parse_path(p) for p in sensitive_paths]
    drift = False
    if desired is None:
        if prior is None and live is None:
            return Change(id=resource_id, type=resource_type, action=Action.UnChanged)
        old = prune(live if live is not None else prior, ignore)
        action = Action.Delete
        raw = [(p, v, None) for p, v in leaves(old, ())]
    elif live is None:
        action = Action.Create
        drift = prior is not None
        raw = [(p, None, v) for p, v in leaves(prune(desired, ignore), ())]
    else:
        want = prune(desired, ignore)
        have = prune(project(live, desired), ignore)
        raw = leaf_changes(have, want)
        if raw and prior is not None:
            # A field differs from desired although the spec left it as it was in prior:
            # so live moved away from prior behind our back.
            before = prune(project(prior, desired), ignore)
            drift = any(_value_at(want, path) == _value_at(before, path) for path, _, _ in raw)
        removals = _removals(live, want, removed_paths, ignore, {path for path, _, _ in raw})
        if removals:
            raw = sorted(raw + removals, key=lambda item: format_path(item[0]))
        action = Action.Update if raw else Action.UnChanged
    diff = [
        FieldChange(
            path=format_path(path),
            old=masked_value(path, old_value, secret),
            new=masked_value(path, new_value, secret),
        )
        for path, old_value, new_value in raw
        if path or old_value or new_value  # an empty object created/deleted has no fields
    ]
    return Change(id=resource_id, type=resource_type, action=action, drift=drift, diff=diff)


def _removals(
    live: Mapping[str, Any],
    want: Any,
    removed_paths: Sequence[str],
    ignore: Sequence[Sequence[Segment]],
    known: set[tuple[Segment, ...]],
) -> list[tuple[tuple[Segment, ...], Any, Any]]:
    """(path, live value, None) for each leaf under ``removed_paths`` that ``live`` holds and
    ``want`` does not, outside ``ignore`` and not already among ``known`` changes."""
    out: list[tuple[tuple[Segment, ...], Any, Any]] = []
    for text in removed_paths:
        try:
            at = tuple(parse_path(text))
        except PathError:
            continue
        value = _value_at(live, at)
        if value is _Absent or _value_at(want, at) is not _Absent:
            continue
        if any(matches_prefix(p, at) for p in ignore):
            continue
        out.extend(
            (path, old, None)
            for path, old in leaves(prune(value, ignore, at), at)
            if path not in known
        )
    return out


def diff_recorded(
    resource_id: str,
    resource_type: str,
    recorded: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    *,
    sensitive_paths: Sequence[str] = (),
) -> Change:
    """What a refresh would record: every field where ``live`` differs from ``recorded``
    (Update, drift), or Delete when the object is gone; sensitive values masked."""
    secret = [parse_path(p) for p in sensitive_paths]
    if live is None:
        action = Action.Delete
        raw = [(p, v, None) for p, v in leaves(recorded, ())]
    else:
        raw = leaf_changes(dict(recorded), dict(live))
        action = Action.Update if raw else Action.UnChanged
    diff = [
        FieldChange(
            path=format_path(path),
            old=masked_value(path, old_value, secret),
            new=masked_value(path, new_value, secret),
        )
        for path, old_value, new_value in raw
        if path or old_value or new_value
    ]
    return Change(
        id=resource_id,
        type=resource_type,
        action=action,
        drift=action is not Action.UnChanged,
        diff=diff,
    )
