"""Sensitivity and masking, and the three-way diff of a preview: desired (spec or runtime's
would-be object) vs live vs prior.

The one owner of what is sensitive (a type's own secret fields, what a runtime reported,
taint through references, values derived from a secret, values equal to a known secret) and
of masking a value (:func:`masked_value`, :func:`mask_attributes`). A preview's change is
masked here as it is made; a release's JSON is masked by
:func:`stackflow.release_diff.masked_release_data`, built on these rules, for every view of a
release (``release show``, ``output``, ``apply --output json``, Kusion export).

Only the fields the spec manages are compared: live is projected onto the shape of desired.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field, model_validator

from stackflow.graph import KUSION_PATH_PREFIX, match_reference
from stackflow.paths import (
    PathError,
    Segment,
    format_path,
    get_path,
    matches_prefix,
    parse_path,
    pattern_below,
)
from stackflow.runtime_rules import rules_for

SENSITIVE_MARKER = "(sensitive value)"


class Action(StrEnum):
    Create = "Create"
    Update = "Update"
    Delete = "Delete"
    UnChanged = "UnChanged"


class FieldChange(BaseModel):
    path: str
    old: Any = None
    new: Any = None


class Change(BaseModel):
    id: str
    type: str
    action: Action
    drift: bool = False
    diff: list[FieldChange] = []


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


RUNTIME_KEY_PREFIX = "_stackflow_"
"""Attributes a runtime records for itself (e.g. Terraform state): never shown."""
RECORDED_SENSITIVE_KEY = "_stackflow_sensitive"
"""A runtime may record here the paths of its live object that hold secrets."""


def recorded_sensitive(attributes: Mapping[str, Any] | None) -> list[str]:
    """The sensitive paths a resource's recorded attributes list for themselves."""
    recorded = (attributes or {}).get(RECORDED_SENSITIVE_KEY)
    return [p for p in recorded if isinstance(p, str)] if isinstance(recorded, list) else []


def sensitive_paths_for(resource_type: str, attributes: Mapping[str, Any] | None) -> list[str]:
    """Default sensitive paths: those the runtime declares by nature (a Kubernetes Secret's
    ``data`` and ``stringData``, :meth:`RuntimeRules.sensitive_paths`), else, for recorded
    state, the runtime's own keys and the paths it recorded as sensitive."""
    if not attributes:
        return []
    rules = rules_for(resource_type)
    own = rules.sensitive_paths(attributes) if rules is not None else []
    if own:
        return own
        return []
    paths = [k for k in attributes if isinstance(k, str) and k.startswith(RUNTIME_KEY_PREFIX)]
    recorded = attributes.get(RECORDED_SENSITIVE_KEY)
    if isinstance(recorded, list):
        paths.extend(p for p in recorded if isinstance(p, str))
    return paths


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


def _leaves(value: Any, at: tuple[Segment, ...]) -> Iterator[tuple[tuple[Segment, ...], Any]]:
    """(path, value) of every leaf; empty containers are leaves."""
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            yield from _leaves(v, (*at, k))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaves(v, (*at, i))
    else:
        yield at, value


def _mask(value: Any, rest: Sequence[Segment]) -> Any:
    """``value`` with the part matched by the relative pattern ``rest`` masked."""
    if not rest:
        return SENSITIVE_MARKER if value is not None else None
    head, tail = rest[0], rest[1:]
    if isinstance(value, Mapping):
        return {k: _mask(v, tail) if head in ("*", k) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, tail) if head in ("*", i) else v for i, v in enumerate(value)]
    return value


def masked_value(
    path: tuple[Segment, ...], value: Any, patterns: Sequence[Sequence[Segment]]
) -> Any:
    for pattern in patterns:
        if matches_prefix(pattern, path):
            return _mask(value, ())
        below = pattern_below(pattern, path)
        if below is not None:
            value = _mask(value, below)
    return value


def mask_attributes(resource_type: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of recorded attributes with every sensitive value replaced by the marker.

    Used wherever state leaves the store for people or scripts (release show, apply output),
    so Secret data, generated passwords and runtime-private state are never printed.
    """
    patterns = [parse_path(p) for p in sensitive_paths_for(resource_type, attributes)]
    return dict(masked_value((), dict(attributes), patterns))


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
                out.extend((p, None, v) for p, v in _leaves(level.t2, path))
            elif level.t2 is notpresent:
                out.extend((p, v, None) for p, v in _leaves(level.t1, path))
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
) -> Change:
    """The change that brings ``live`` to ``desired``, with drift judged against ``prior``.

    - desired None: Delete if the resource is in prior state or still live, else UnChanged.
    - live None: Create (drift if prior says it existed: someone deleted it).
    - otherwise Update if live (projected onto desired) differs from desired, else UnChanged;
      drift if a differing field was not changed by the spec since prior.
    """
    ignore = [parse_path(p) for p in ignore_fields]
    secret = [parse_path(p) for p in sensitive_paths]
    drift = False
    if desired is None:
        if prior is None and live is None:
            return Change(id=resource_id, type=resource_type, action=Action.UnChanged)
        old = prune(live if live is not None else prior, ignore)
        action = Action.Delete
        raw = [(p, v, None) for p, v in _leaves(old, ())]
    elif live is None:
        action = Action.Create
        drift = prior is not None
        raw = [(p, None, v) for p, v in _leaves(prune(desired, ignore), ())]
    else:
        want = prune(desired, ignore)
        have = prune(project(live, desired), ignore)
        raw = leaf_changes(have, want)
        action = Action.Update if raw else Action.UnChanged
        if raw and prior is not None:
            # A field differs from desired although the spec left it as it was in prior:
            # so live moved away from prior behind our back.
            before = prune(project(prior, desired), ignore)
            drift = any(_value_at(want, path) == _value_at(before, path) for path, _, _ in raw)
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
        raw = [(p, v, None) for p, v in _leaves(recorded, ())]
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


def _covers(sensitive: Sequence[Sequence[Segment]], path: Sequence[Segment]) -> bool:
    """Whether a value at ``path`` holds a sensitive value: it is one, lies inside one, or
    (a whole object) contains one."""
    return any(
        matches_prefix(pattern, path) or pattern_below(pattern, path) is not None
        for pattern in sensitive
    )


def tainted_paths(
    attributes: Any, dependencies: Mapping[str, tuple[str, Mapping[str, Any] | None]]
) -> list[str]:
    """Paths of ``attributes`` whose ``$kusion_path`` reference takes a sensitive value of a
    dependency (``dependencies``: id → (type, recorded attributes)), so taint follows
    references: a generated password handed to a plain field is masked there too."""
    found: list[str] = []
    stack: list[tuple[tuple[Segment, ...], Any]] = [((), attributes)]
    while stack:
        at, value = stack.pop()
        if isinstance(value, str):
            if not value.startswith(KUSION_PATH_PREFIX):
                continue
            ref = match_reference(value, dependencies)
            if ref is None:
                continue
            kind, recorded = dependencies[ref.resource_id]
            sensitive = [parse_path(p) for p in sensitive_paths_for(kind, recorded)]
            target = parse_path(ref.path) if ref.path else []
            if sensitive and _covers(sensitive, target):
                found.append(format_path(at))
        elif isinstance(value, Mapping):
            stack.extend(((*at, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*at, i), v) for i, v in enumerate(value))
    return sorted(found)


# ---- derived sensitivity -----------------------------------------------------------------------
MIN_SECRET_LENGTH = 6
"""Known sensitive values shorter than this are not looked for elsewhere (equal-value rule):
``true``, ``80`` or ``admin`` would mask half a stack by coincidence."""


def _all_patterns(paths: Sequence[str]) -> list[list[Segment]]:
    out = []
    for path in paths:
        try:
            out.append(parse_path(path))
        except PathError:
            continue
    return out


def input_paths(desired: Any, paths: Sequence[str]) -> list[str]:
    """Of ``paths``, those that name a value present in ``desired`` (an input of the spec,
    as opposed to one the runtime computes)."""
    found = []
    for path in paths:
        try:
            get_path(desired, parse_path(path))
        except PathError:
            continue
        found.append(path)
    return found


def derived_sensitive_paths(
    desired: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    sensitive_inputs: Sequence[str],
    *,
    placeholders: Container[Any] = (),
    computed_only: bool = False,
) -> list[str]:
    """Paths of ``live`` that may carry a secret because the resource was given one.

    When any of the resource's desired attributes (``desired``, references resolved) is
    sensitive (``sensitive_inputs``: taint, a Secret's data, an argument the runtime marks
    sensitive), everything the runtime computed for it is treated as sensitive too (a
    ``terraform_data.output``, a hash, a connection string...): every path of ``live`` that
    is not a plain copy of a non-sensitive desired input. A field whose value equals the
    desired one at the same path (and no sensitive input lies at or under it) is a copy;
    containers are compared field by field; ``None`` (and ``placeholders`` such as
    ``(known after apply)``) carry nothing. Runtime-private keys (``_stackflow_…``) are left
    out: they are sensitive anyway. Nothing is derived when no input is sensitive.
    ``computed_only``: only fields the spec does not give (a live object's previous values
    of the spec's own fields are what a preview's diff is about)."""
    patterns = _all_patterns(sensitive_inputs)
    if not patterns or not live:
        return []
    found: list[str] = []

    def carries(value: Any) -> bool:
        if value is None or (isinstance(value, str | int | float) and value in placeholders):
            return False
        if isinstance(value, Mapping):
            return any(carries(v) for v in value.values())
        if isinstance(value, list):
            return any(carries(v) for v in value)
        return True

    def walk(at: tuple[Segment, ...], want: Any, have: Any) -> None:
        if any(matches_prefix(p, at) for p in patterns):
            if carries(have):
                found.append(format_path(at))  # a sensitive input itself, or inside one
            return
        if want is _Absent:
            if carries(have):
                found.append(format_path(at))
            return
        below = any(pattern_below(p, at) is not None for p in patterns)
        if not below and want == have:
            return  # a plain copy of a non-sensitive input
        if isinstance(have, Mapping) and isinstance(want, Mapping):
            for key, value in have.items():
                walk((*at, key), want.get(key, _Absent), value)
        elif isinstance(have, list) and isinstance(want, list):
            for index, value in enumerate(have):
                walk((*at, index), want[index] if index < len(want) else _Absent, value)
        elif carries(have) and not computed_only:
            found.append(format_path(at))

    for key, value in live.items():
        if isinstance(key, str) and key.startswith(RUNTIME_KEY_PREFIX):
            continue
        walk((key,), desired.get(key, _Absent), value)
    return sorted(set(found))


def _secret_forms(value: Any) -> Iterator[str]:
    """How a known sensitive scalar is looked for: its text (JSON for numbers) and, for a
    string, its base64 form (Kubernetes Secret data); shorter ones are not looked for."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, str):
        if len(value) >= MIN_SECRET_LENGTH:
            yield value
            yield base64.b64encode(value.encode()).decode()
    elif isinstance(value, int | float):
        text = json.dumps(value)
        if len(text) >= MIN_SECRET_LENGTH:
            yield text


def _scalar_key(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return None


def sensitive_values(attributes: Any, paths: Sequence[str]) -> set[str]:
    """The known sensitive values of ``attributes``: every scalar at or under one of
    ``paths``, in the forms the equal-value rule looks for (:data:`MIN_SECRET_LENGTH`).
    Runtime-private keys (whole documents such as a Terraform state) are not collected."""
    out: set[str] = set()
    for pattern in _all_patterns(paths):
        if pattern and isinstance(pattern[0], str) and pattern[0].startswith(RUNTIME_KEY_PREFIX):
            continue
        for value in _matching(attributes, pattern):
            for leaf in _plain_leaves(value):
                out.update(_secret_forms(leaf))
    return out


def _plain_leaves(value: Any) -> Iterator[Any]:
    """Scalars of ``value``, sealed values (``{"$sealed": …}``: ciphertext, key id, path)
    left out: only a value in clear is a known secret."""
    if isinstance(value, Mapping):
        if "$sealed" in value:
            return
        for sub in value.values():
            yield from _plain_leaves(sub)
    elif isinstance(value, list):
        for sub in value:
            yield from _plain_leaves(sub)
    else:
        yield value


def _matching(value: Any, pattern: Sequence[Segment]) -> Iterator[Any]:
    if not pattern:
        yield value
        return
    head, rest = pattern[0], pattern[1:]
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if head in ("*", key):
                yield from _matching(sub, rest)
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            if head in ("*", index):
                yield from _matching(sub, rest)


class SecretSet(Container[str]):
    """Known sensitive values kept as keyed digests (the key is random, per process): a
    value can be looked up, never read back, so a worker may remember a stack's secrets
    between activities without holding them in clear."""

    _KEY = os.urandom(32)

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._digests = {self._digest(v) for v in values}

    @classmethod
    def _digest(cls, value: str) -> bytes:
        data = value.encode("utf-8", errors="surrogatepass")
        return hashlib.blake2b(data, key=cls._KEY, digest_size=16).digest()

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and self._digest(value) in self._digests

    def __len__(self) -> int:
        return len(self._digests)

    def __or__(self, other: SecretSet) -> SecretSet:
        joined = SecretSet()
        joined._digests = self._digests | other._digests
        return joined


def equal_value_paths(attributes: Mapping[str, Any] | None, secrets: Container[str]) -> list[str]:
    """The last line of defence: paths of ``attributes`` whose scalar value equals a known
    sensitive value of the stack (``secrets``, from :func:`sensitive_values`), wherever it
    turns up. Runtime-private keys are left out (sensitive anyway)."""
    if not attributes or not secrets:
        return []
    found = []
    for key, value in attributes.items():
        if isinstance(key, str) and key.startswith(RUNTIME_KEY_PREFIX):
            continue
        for path, leaf in _leaves(value, (key,)):
            text = _scalar_key(leaf)
            if text is not None and len(text) >= MIN_SECRET_LENGTH and text in secrets:
                found.append(format_path(path))
    return sorted(found)
