"""What is sensitive, and masking it: the one owner of both.

A value is sensitive when its runtime says so by nature (a Kubernetes Secret's ``data``,
:meth:`stackflow.model.runtime_rules.RuntimeRules.sensitive_paths`), when the runtime recorded it
as such (``_stackflow_sensitive``, Terraform's sensitive attributes), when it is taken
through a ``$kusion_path`` reference from a sensitive one (taint, followed along chains),
when a runtime computed it for a resource that was given a secret (derived), or when it
equals a known secret of the stack (the last line of defence). Runtime-private keys
(``_stackflow_…``) and the spec's ``context.env`` are never shown.

Everything that shows a value to people or scripts masks it here: a preview's changes
(:mod:`stackflow.engine.diff`), a release's views (:func:`masked_release_data`: ``release show``,
``output``, ``apply --output json``, Kusion export), the release diff
(:mod:`stackflow.engine.release_diff`) and a message of the infrastructure quoting the object
(:func:`mask_text`: a Kubernetes admission denial's).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from stackflow.core.errors import GraphError
from stackflow.core.paths import (
    PathError,
    Segment,
    format_path,
    get_path,
    leaves,
    matches_prefix,
    parse_path,
    parse_patterns,
    pattern_below,
    touches,
)
from stackflow.engine.graph import KUSION_PATH_PREFIX, find_references, match_reference
from stackflow.model.release import Release
from stackflow.model.runtime_rules import rules_for
from stackflow.model.spec import SET_SECRETS, Resource, Spec

SENSITIVE_MARKER = "(sensitive value)"
CONTEXT_ENV = "context.env"
"""The spec's provider credentials: every value masked, the keys shown."""

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
    paths = [k for k in attributes if isinstance(k, str) and k.startswith(RUNTIME_KEY_PREFIX)]
    recorded = attributes.get(RECORDED_SENSITIVE_KEY)
    if isinstance(recorded, list):
        paths.extend(p for p in recorded if isinstance(p, str))
    return paths


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


def masked_value(path: Sequence[Segment], value: Any, patterns: Sequence[Sequence[Segment]]) -> Any:
    """``value`` (found at ``path``) with every part the ``patterns`` match replaced by the
    marker."""
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


_ABSENT = _Absent()


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
            if sensitive and touches(sensitive, target):
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
    patterns = parse_patterns(sensitive_inputs)
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
        if want is _ABSENT:
            if carries(have):
                found.append(format_path(at))
            return
        below = any(pattern_below(p, at) is not None for p in patterns)
        if not below and want == have:
            return  # a plain copy of a non-sensitive input
        if isinstance(have, Mapping) and isinstance(want, Mapping):
            for key, value in have.items():
                walk((*at, key), want.get(key, _ABSENT), value)
        elif isinstance(have, list) and isinstance(want, list):
            for index, value in enumerate(have):
                walk((*at, index), want[index] if index < len(want) else _ABSENT, value)
        elif carries(have) and not computed_only:
            found.append(format_path(at))

    for key, value in live.items():
        if isinstance(key, str) and key.startswith(RUNTIME_KEY_PREFIX):
            continue
        walk((key,), desired.get(key, _ABSENT), value)
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
    for pattern in parse_patterns(paths):
        if pattern and isinstance(pattern[0], str) and pattern[0].startswith(RUNTIME_KEY_PREFIX):
            continue
        for value in _matching(attributes, pattern):
            for leaf in _plainleaves(value):
                out.update(_secret_forms(leaf))
    return out


def mask_text(text: str, attributes: Any, paths: Sequence[str]) -> str:
    """``text`` (a message that may quote the object, such as an admission policy's denial)
    with every sensitive value of ``attributes`` (every scalar at or under one of ``paths``)
    replaced by the marker, in each form it may be quoted in: as given, base64-encoded (a
    Kubernetes Secret's ``data`` as the API server holds it), base64-decoded (``data`` given
    encoded) and JSON-escaped. Unlike the equal-value rule no value is too short to mask; one
    shorter than :data:`MIN_SECRET_LENGTH` is masked where it stands alone (not inside a
    longer word), lest a ``1`` or an ``on`` mask half the message. Runtime-private keys and
    sealed values are not looked for."""
    forms: set[str] = set()
    for pattern in parse_patterns(paths):
        if pattern and isinstance(pattern[0], str) and pattern[0].startswith(RUNTIME_KEY_PREFIX):
            continue
        for value in _matching(attributes, pattern):
            for leaf in _plainleaves(value):
                forms.update(_quoted_forms(leaf))
    forms.discard("")
    if not forms:
        return text
    alternatives = [
        re.escape(form) if len(form) >= MIN_SECRET_LENGTH else rf"(?<!\w){re.escape(form)}(?!\w)"
        for form in sorted(forms, key=lambda f: (-len(f), f))
    ]
    return re.sub("|".join(alternatives), SENSITIVE_MARKER, text)


_WHITESPACE = str.maketrans("", "", "\t\n\r")


def _quoted_forms(value: Any) -> Iterator[str]:
    """Every form a sensitive scalar may be quoted in (see :func:`mask_text`)."""
    text = _scalar_key(value)
    if not text:
        return
    yield text
    yield json.dumps(text)[1:-1]
    yield base64.b64encode(text.encode("utf-8", errors="surrogatepass")).decode()
    try:
        decoded = base64.b64decode(text, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return
    if decoded.translate(_WHITESPACE).isprintable():  # text, not random bytes
        yield decoded
        yield json.dumps(decoded)[1:-1]


def _plainleaves(value: Any) -> Iterator[Any]:
    """Scalars of ``value``, sealed values (``{"$sealed": …}``: ciphertext, key id, path)
    left out: only a value in clear is a known secret."""
    if isinstance(value, Mapping):
        if "$sealed" in value:
            return
        for sub in value.values():
            yield from _plainleaves(sub)
    elif isinstance(value, list):
        for sub in value:
            yield from _plainleaves(sub)
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
        for path, leaf in leaves(value, (key,)):
            text = _scalar_key(leaf)
            if text is not None and len(text) >= MIN_SECRET_LENGTH and text in secrets:
                found.append(format_path(path))
    return sorted(found)


# ---- a release's views -----------------------------------------------------------------------


def release_sensitive_paths(spec: Spec | None, state: Iterable[Resource]) -> dict[str, set[str]]:
    """Per resource id, the paths of its attributes that hold sensitive values in a release:
    what the spec and the recorded state say for themselves (:func:`sensitive_paths_for`,
    which includes the paths the apply recorded as tainted), plus taint through the spec's
    ``$kusion_path`` references, followed along chains (a value taken from a value taken from
    a secret is masked too), plus any recorded value equal to a sensitive value of the
    release (:func:`equal_value_paths`: also in releases recorded before
    derived values were marked, say a ``terraform_data.output`` of a password)."""
    state = list(state)
    paths = _own_and_tainted_paths(spec, state)
    secrets: set[str] = set()
    for resource in state:
        secrets |= sensitive_values(resource.attributes, sorted(paths.get(resource.id, ())))
    taken = _set_secrets(spec)
    secrets |= taken
    if secrets:
        for resource in [*state, *(spec.resources if spec is not None and taken else ())]:
            found = equal_value_paths(resource.attributes, secrets)
            if found:
                paths.setdefault(resource.id, set()).update(found)
    return paths


def _set_secrets(spec: Spec | None) -> set[str]:
    """The values a set's resolved spec took from another stack's secrets (SET_SECRETS)."""
    taken = spec.context.get(SET_SECRETS) if spec is not None else None
    return sensitive_values(taken, ["*"]) if taken else set()


def _own_and_tainted_paths(spec: Spec | None, state: list[Resource]) -> dict[str, set[str]]:
    types: dict[str, str] = {}
    paths: dict[str, set[str]] = {}
    for resource in state:
        types[resource.id] = str(resource.type)
        paths.setdefault(resource.id, set()).update(
            sensitive_paths_for(str(resource.type), resource.attributes)
        )
    if spec is None:
        return paths
    referencing: list[tuple[Resource, list[str]]] = []
    known = {r.id for r in spec.resources} | set(types)
    for resource in spec.resources:
        types.setdefault(resource.id, str(resource.type))
        paths.setdefault(resource.id, set()).update(
            sensitive_paths_for(str(resource.type), resource.attributes)
        )
        try:
            refs = find_references(resource.attributes, known)
        except GraphError:  # a reference to nothing (an imported release): no taint from it
            refs = []
        deps = sorted({ref.resource_id for ref in refs})
        if deps:
            referencing.append((resource, deps))
    changed = True
    while changed:  # to a fixpoint: at most one round per link of the longest chain
        changed = False
        for resource, deps in referencing:
            recorded = {
                dep: (types[dep], {RECORDED_SENSITIVE_KEY: sorted(paths.get(dep, ()))})
                for dep in deps
            }
            found = set(tainted_paths(resource.attributes, recorded)) - paths[resource.id]
            if found:
                paths[resource.id] |= found
                changed = True
    return paths


def mask_recorded(attributes: Mapping[str, Any], sensitive: Iterable[str]) -> dict[str, Any]:
    """Recorded attributes with every value at or under a ``sensitive`` path masked (as
    :func:`mask_attributes`, with the paths of :func:`release_sensitive_paths`
    given)."""
    return dict(masked_value((), dict(attributes), parse_patterns(sensitive)))


def masked_release_data(release: Release) -> dict[str, Any]:
    """A release's JSON form with every sensitive value masked: the resources of its spec
    and state (each type's own secret fields and what was recorded sensitive), the spec's
    ``context.env`` (provider credentials), and, in its recorded state, every value taken
    through the spec's ``$kusion_path`` references from a sensitive one (a release imported
    from Kusion records no such marks). Every view of a release goes through here."""
    data = release.model_dump(mode="json", by_alias=True)
    for section in ("state", "spec"):
        for raw in (data.get(section) or {}).get("resources") or []:
            raw["attributes"] = mask_attributes(raw.get("type", ""), raw.get("attributes") or {})
    context = (data.get("spec") or {}).get("context")
    if isinstance(context, dict) and isinstance(context.get("env"), dict):
        context["env"] = dict.fromkeys(context["env"], SENSITIVE_MARKER)
    taken = _set_secrets(release.spec)
    if isinstance(context, dict) and SET_SECRETS in context:
        context[SET_SECRETS] = SENSITIVE_MARKER
        for raw in data["spec"].get("resources") or []:
            found = equal_value_paths(raw.get("attributes"), taken)
            if found:
                raw["attributes"] = mask_recorded(raw["attributes"], found)
    sensitive = release_sensitive_paths(release.spec, release.state.resources)
    for raw in (data.get("state") or {}).get("resources") or []:
        paths = sensitive.get(str(raw.get("id")))
        if paths:
            raw["attributes"] = mask_recorded(raw.get("attributes") or {}, paths)
    return data
