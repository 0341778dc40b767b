"""What changed between two releases of a stack, in the spec and in the recorded state, and
the lookup of one recorded value (``stackflow output ID.path``). Pure: the CLI reads the
releases from the state backend and hands them over.

Masking follows the rest of stackflow (:mod:`stackflow.diff`): Secret ``data``/``stringData``,
runtime-private keys, the paths a runtime recorded as sensitive, values taken through
``$kusion_path`` from a sensitive one (taint follows chains of references), and the spec's
``context.env``. A path sensitive in either revision is masked on both sides. Sensitive values
are compared in this process (the backend opens sealed values when the keys are present): a
change says ``changed`` with ``sensitive: true`` and both values masked. A value still sealed
(this process has no keys) is compared by its ciphertext: the same ciphertext is unchanged,
another one is ``unknown`` (it may hold the same value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field

from stackflow.diff import (
    RECORDED_SENSITIVE_KEY,
    RUNTIME_KEY_PREFIX,
    SENSITIVE_MARKER,
    equal_value_paths,
    leaf_changes,
    mask_attributes,
    masked_value,
    sensitive_paths_for,
    sensitive_values,
    tainted_paths,
)
from stackflow.errors import GraphError, NotFoundError
from stackflow.graph import find_references
from stackflow.paths import (
    PathError,
    Segment,
    format_path,
    get_path,
    matches_prefix,
    parse_path,
    pattern_below,
)
from stackflow.refs import StackFields, StackRef
from stackflow.release import Release
from stackflow.spec import Resource, Spec

SEALED = "$sealed"  # the envelope of stackflow.state.sealing, left in place without keys
_SEALED_TOKEN = "\x00sealed\x00"


class FieldChangeKind(StrEnum):
    added = "added"
    removed = "removed"
    changed = "changed"
    unknown = "unknown"
    """Sealed on a side and this process has no keys: the ciphertexts differ, the values
    may not."""


class ResourceChangeKind(StrEnum):
    added = "added"
    removed = "removed"
    changed = "changed"


class FieldChange(BaseModel):
    """One field that differs; ``old``/``new`` are None where the field is absent, and the
    masking marker where it is sensitive (``sensitive: true``)."""

    path: str
    kind: FieldChangeKind
    old: Any = None
    new: Any = None
    sensitive: bool = False


class ResourceDiff(BaseModel):
    """A resource added, removed or changed; for a changed one, what differs: ``fields``
    (paths into ``attributes``), ``depends_on_added``/``_removed``, ``extensions`` (paths
    into ``extensions``) and ``old_type`` when the type changed."""

    id: str
    type: str
    change: ResourceChangeKind
    old_type: str | None = None
    fields: list[FieldChange] = Field(default_factory=list)
    depends_on_added: list[str] = Field(default_factory=list)
    depends_on_removed: list[str] = Field(default_factory=list)
    extensions: list[FieldChange] = Field(default_factory=list)


class SectionDiff(BaseModel):
    """The resources of one section (spec or state) that differ, by id; ``unchanged`` counts
    the others."""

    resources: list[ResourceDiff] = Field(default_factory=list)
    unchanged: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> dict[str, int]:
        counts = {kind.value: 0 for kind in ResourceChangeKind}
        for resource in self.resources:
            counts[resource.change.value] += 1
        return {**counts, "unchanged": self.unchanged}


class SpecDiff(SectionDiff):
    """The spec's resources, plus ``fields``: changes outside them (``context.…``,
    ``secretStore.…``; ``context.env`` masked). ``missing``: revisions that recorded no spec
    (then the specs are not compared)."""

    fields: list[FieldChange] = Field(default_factory=list)
    missing: list[int] = Field(default_factory=list)


class ReleaseDiff(StackFields, BaseModel):
    project: str
    workspace: str
    old_revision: int
    new_revision: int
    spec: SpecDiff
    state: SectionDiff

    @property
    def empty(self) -> bool:
        return not (self.spec.resources or self.spec.fields or self.state.resources)


# ---- sensitivity -----------------------------------------------------------------------------


def release_sensitive_paths(spec: Spec | None, state: Iterable[Resource]) -> dict[str, set[str]]:
    """Per resource id, the paths of its attributes that hold sensitive values in a release:
    what the spec and the recorded state say for themselves (:func:`sensitive_paths_for`,
    which includes the paths the apply recorded as tainted), plus taint through the spec's
    ``$kusion_path`` references, followed along chains (a value taken from a value taken from
    a secret is masked too), plus any recorded value equal to a sensitive value of the
    release (:func:`stackflow.diff.equal_value_paths`: also in releases recorded before
    derived values were marked, say a ``terraform_data.output`` of a password)."""
    state = list(state)
    paths = _own_and_tainted_paths(spec, state)
    secrets: set[str] = set()
    for resource in state:
        secrets |= sensitive_values(resource.attributes, sorted(paths.get(resource.id, ())))
    if secrets:
        for resource in state:
            found = equal_value_paths(resource.attributes, secrets)
            if found:
                paths.setdefault(resource.id, set()).update(found)
    return paths


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


def _patterns(paths: Iterable[str]) -> list[list[Segment]]:
    out = []
    for path in sorted(set(paths)):
        try:
            out.append(parse_path(path))
        except PathError:
            continue  # a malformed recorded path cannot match anything
    return out


def _touches(patterns: Sequence[Sequence[Segment]], at: Sequence[Segment]) -> bool:
    """Whether the value at ``at`` is sensitive, lies inside one, or contains one."""
    return any(matches_prefix(p, at) or pattern_below(p, at) is not None for p in patterns)


def mask_value(at: Sequence[Segment], value: Any, patterns: Sequence[Sequence[Segment]]) -> Any:
    """``value`` (found at ``at``) with its sensitive parts replaced by the marker."""
    return masked_value(tuple(at), value, patterns)


def mask_recorded(attributes: Mapping[str, Any], sensitive: Iterable[str]) -> dict[str, Any]:
    """Recorded attributes with every value at or under a ``sensitive`` path masked (as
    :func:`stackflow.diff.mask_attributes`, with the paths of :func:`release_sensitive_paths`
    given)."""
    return dict(mask_value((), dict(attributes), _patterns(sensitive)))


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
    sensitive = release_sensitive_paths(release.spec, release.state.resources)
    for raw in (data.get("state") or {}).get("resources") or []:
        paths = sensitive.get(str(raw.get("id")))
        if paths:
            raw["attributes"] = mask_recorded(raw.get("attributes") or {}, paths)
    return data


# ---- diffs -----------------------------------------------------------------------------------


def _seal_tokens(value: Any) -> Any:
    """``value`` with every still-sealed envelope replaced by a token of its ciphertext (so
    equal ciphertexts compare equal and a diff never walks into an envelope)."""
    if isinstance(value, Mapping):
        inner = value.get(SEALED)
        if len(value) == 1 and isinstance(inner, Mapping):
            return _SEALED_TOKEN + json.dumps(inner, sort_keys=True, default=str)
        return {k: _seal_tokens(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_seal_tokens(v) for v in value]
    return value


def _is_token(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(_SEALED_TOKEN)


def _holds_token(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_holds_token(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_token(v) for v in value)
    return _is_token(value)


def _present(value: Any, at: Sequence[Segment]) -> bool:
    try:
        get_path(value, at)
    except PathError:
        return False
    return True


def field_changes(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    sensitive: Iterable[str] = (),
) -> list[FieldChange]:
    """Leaf-level changes from ``old`` to ``new`` (the engine's field diff), values at or
    under the ``sensitive`` paths masked on both sides."""
    patterns = _patterns(sensitive)
    before, after = _seal_tokens(dict(old)), _seal_tokens(dict(new))
    out = []
    for segments, old_value, new_value in leaf_changes(before, after):
        at = tuple(segments)
        sealed = _holds_token(old_value) or _holds_token(new_value)
        if not _present(before, segments):
            kind = FieldChangeKind.added
        elif not _present(after, segments):
            kind = FieldChangeKind.removed
        else:
            kind = FieldChangeKind.unknown if sealed else FieldChangeKind.changed
        secret = sealed or _touches(patterns, at)
        if sealed:
            shown_old = None if old_value is None else mask_value((), old_value, [[]])
            shown_new = None if new_value is None else mask_value((), new_value, [[]])
        else:
            shown_old = mask_value(at, old_value, patterns)
            shown_new = mask_value(at, new_value, patterns)
        out.append(
            FieldChange(
                path=format_path(at), kind=kind, old=shown_old, new=shown_new, sensitive=secret
            )
        )
    return out


def _visible(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes without the runtime's private keys (Terraform state, the list of sensitive
    paths): bookkeeping, never shown, and mirrored by the attributes anyway."""
    return {
        k: v
        for k, v in attributes.items()
        if not (isinstance(k, str) and k.startswith(RUNTIME_KEY_PREFIX))
    }


def diff_resource(
    old: Resource | None, new: Resource | None, sensitive: Iterable[str] = ()
) -> ResourceDiff | None:
    """How ``new`` differs from ``old`` (None: absent); None when they are the same."""
    if old is None and new is None:
        return None
    if old is None or new is None:
        present = new if new is not None else old
        assert present is not None
        kind = ResourceChangeKind.added if old is None else ResourceChangeKind.removed
        return ResourceDiff(id=present.id, type=str(present.type), change=kind)
    paths = list(sensitive)
    fields = field_changes(_visible(old.attributes), _visible(new.attributes), paths)
    extensions = field_changes(old.extensions, new.extensions)
    added = sorted(set(new.depends_on) - set(old.depends_on))
    removed = sorted(set(old.depends_on) - set(new.depends_on))
    old_type = str(old.type) if old.type != new.type else None
    if not (fields or extensions or added or removed or old_type):
        return None
    return ResourceDiff(
        id=new.id,
        type=str(new.type),
        change=ResourceChangeKind.changed,
        old_type=old_type,
        fields=fields,
        depends_on_added=added,
        depends_on_removed=removed,
        extensions=extensions,
    )


def diff_section(
    old: Iterable[Resource], new: Iterable[Resource], sensitive: Mapping[str, Iterable[str]]
) -> SectionDiff:
    """Resources by id (sorted), each with the sensitive paths ``sensitive`` gives its id."""
    before = {r.id: r for r in old}
    after = {r.id: r for r in new}
    section = SectionDiff()
    for rid in sorted(before.keys() | after.keys()):
        found = diff_resource(before.get(rid), after.get(rid), sensitive.get(rid, ()))
        if found is None:
            section.unchanged += 1
        else:
            section.resources.append(found)
    return section


CONTEXT_ENV = "context.env"


def _spec_settings(spec: Spec) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if spec.context:
        data["context"] = spec.context
    if spec.secret_store is not None:
        data["secretStore"] = spec.secret_store
    return data


def diff_releases(
    stack: StackRef,
    old_revision: int,
    old_spec: Spec | None,
    old_state: Sequence[Resource],
    new_revision: int,
    new_spec: Spec | None,
    new_state: Sequence[Resource],
) -> ReleaseDiff:
    """What changed from release ``old_revision`` to ``new_revision``: spec and state."""
    sensitive: dict[str, set[str]] = {}
    for found in (
        release_sensitive_paths(old_spec, old_state),
        release_sensitive_paths(new_spec, new_state),
    ):
        for rid, paths in found.items():
            sensitive.setdefault(rid, set()).update(paths)
    missing = [
        revision
        for revision, spec in ((old_revision, old_spec), (new_revision, new_spec))
        if spec is None
    ]
    if old_spec is not None and new_spec is not None:
        resources = diff_section(old_spec.resources, new_spec.resources, sensitive)
        settings = field_changes(_spec_settings(old_spec), _spec_settings(new_spec), [CONTEXT_ENV])
        spec = SpecDiff(resources=resources.resources, unchanged=resources.unchanged)
        spec.fields = settings
    else:
        spec = SpecDiff(missing=sorted(set(missing)))
    return ReleaseDiff(
        project=stack.project,
        workspace=stack.workspace,
        old_revision=old_revision,
        new_revision=new_revision,
        spec=spec,
        state=diff_section(old_state, new_state, sensitive),
    )


# ---- one recorded value ----------------------------------------------------------------------


class Lookup(BaseModel):
    """The value ``stackflow output ID.path`` names, masked unless asked otherwise."""

    id: str
    path: str
    """The path into the resource's attributes ("" for all of them), as stackflow writes it."""
    value: Any
    sensitive: bool
    """Whether the value is, holds or lies inside a sensitive one."""


def resolve_resource(target: str, ids: Iterable[str]) -> tuple[str, str] | None:
    """Split ``ID[.path]`` at the longest recorded id followed by ``.``, ``[`` or the end
    (ids may contain ``:``, ``/`` and ``.``)."""
    best: str | None = None
    for rid in ids:
        if (target == rid or target.startswith((rid + ".", rid + "["))) and (
            best is None or len(rid) > len(best)
        ):
            best = rid
    if best is None:
        return None
    return best, target[len(best) :].removeprefix(".")


_INDEX = re.compile(r"\d+")
_BRACKET = re.compile(r'\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]')


def walk_path(value: Any, path: str) -> tuple[list[Segment], Any]:
    """Follow a dotted ``path`` into ``value``: a key of a mapping (the longest one the path
    starts with, so keys may contain dots, as ``app.kubernetes.io/name``), a list index as a
    number (``ports.0.port``) or in brackets (``ports[0]``, ``["a.b"]``). Raises PathError
    naming the part that is missing."""
    at: list[Segment] = []
    rest = path
    current = value
    while rest:
        bracket = _BRACKET.match(rest)
        segment: Segment
        if bracket is not None:
            index, quoted = bracket.groups()
            segment = int(index) if index is not None else json.loads(f'"{quoted}"')
            rest = rest[bracket.end() :]
        elif isinstance(current, Mapping):
            keys = [
                k
                for k in current
                if isinstance(k, str) and (rest == k or rest.startswith((k + ".", k + "[")))
            ]
            if not keys:
                raise PathError(f"no field {_show(at, rest)}")
            segment = max(keys, key=len)
            rest = rest[len(segment) :]
        elif isinstance(current, list):
            match = _INDEX.match(rest)
            if match is None or rest[match.end() : match.end() + 1] not in ("", ".", "["):
                raise PathError(f"{format_path(at) or 'the value'} is a list: index it by number")
            segment = int(match.group())
            rest = rest[match.end() :]
        else:
            raise PathError(f"no field {_show(at, rest)}")
        rest = rest.removeprefix(".")
        if isinstance(segment, int):
            if not isinstance(current, list) or not 0 <= segment < len(current):
                size = f" (it has {len(current)} items)" if isinstance(current, list) else ""
                raise PathError(f"no field {format_path([*at, segment])}{size}")
        elif not isinstance(current, Mapping) or segment not in current:
            raise PathError(f"no field {format_path([*at, segment])}")
        current = current[segment]
        at.append(segment)
    return at, current


def _show(at: Sequence[Segment], rest: str) -> str:
    head = format_path(at)
    return f"{head}.{rest}" if head else rest


def lookup(
    target: str,
    resources: Sequence[Resource],
    sensitive: Mapping[str, Iterable[str]],
    *,
    show_sensitive: bool = False,
    where: str = "",
) -> Lookup:
    """The value ``ID[.path]`` names among the recorded ``resources``, masked with the
    resource's ``sensitive`` paths unless ``show_sensitive``. NotFoundError (one line, naming
    ``where``) for an unknown id or path."""
    by_id = {r.id: r for r in resources}
    split = resolve_resource(target, by_id)
    if split is None:
        raise NotFoundError(f"{target}: no such resource in {where}".rstrip())
    rid, path = split
    try:
        at, value = walk_path(by_id[rid].attributes, path)
    except PathError as exc:
        raise NotFoundError(f"{rid}: {exc} in {where}".rstrip()) from None
    patterns = _patterns(sensitive.get(rid, ()))
    secret = _touches(patterns, at)
    if not show_sensitive:
        value = mask_value(at, value, patterns)
    return Lookup(id=rid, path=format_path(at), value=value, sensitive=secret)


def still_sealed(value: Any) -> bool:
    """Whether ``value`` holds a sealed envelope (its process had no keys to open it)."""
    return _holds_token(_seal_tokens(value))
