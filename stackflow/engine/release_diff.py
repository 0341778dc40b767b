"""What changed between two releases of a stack, in the spec and in the recorded state, and
the lookup of one recorded value (``stackflow output ID.path``). Pure: the CLI reads the
releases from the state backend and hands them over.

Masking is :mod:`stackflow.engine.masking`'s, as everywhere (:func:`release_sensitive_paths`):
Secret ``data``/``stringData``, runtime-private keys, the paths a runtime recorded as
sensitive, values taken through ``$kusion_path`` from a sensitive one (taint follows chains
of references), and the spec's ``context.env``. A path sensitive in either revision is masked
on both sides. Sensitive values are compared in this process (the backend opens sealed values
when the keys are present): a change says ``changed`` with ``sensitive: true`` and both
values masked. A value still sealed (this process has no keys) is compared by its ciphertext:
the same ciphertext is unchanged, another one is ``unknown`` (it may hold the same value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field

from stackflow.core.errors import NotFoundError
from stackflow.core.paths import (
    PathError,
    Segment,
    format_path,
    get_path,
    parse_patterns,
    touches,
)
from stackflow.core.refs import StackFields, StackRef
from stackflow.engine.diff import FieldChange, leaf_changes
from stackflow.engine.masking import (
    CONTEXT_ENV,
    RUNTIME_KEY_PREFIX,
    SENSITIVE_MARKER,
    masked_value,
    release_sensitive_paths,
)
from stackflow.model.spec import SET_SECRETS, Resource, Spec

SET_SECRETS_PATH = f"context.{SET_SECRETS}"

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


class FieldDiff(FieldChange):
    """A :class:`~stackflow.engine.diff.FieldChange` between two releases, with its ``kind`` and
    whether it is ``sensitive`` (then ``old``/``new`` are the masking marker)."""

    kind: FieldChangeKind
    sensitive: bool = False


class ResourceDiff(BaseModel):
    """A resource added, removed or changed; for a changed one, what differs: ``fields``
    (paths into ``attributes``), ``depends_on_added``/``_removed``, ``extensions`` (paths
    into ``extensions``) and ``old_type`` when the type changed."""

    id: str
    type: str
    change: ResourceChangeKind
    old_type: str | None = None
    fields: list[FieldDiff] = Field(default_factory=list)
    depends_on_added: list[str] = Field(default_factory=list)
    depends_on_removed: list[str] = Field(default_factory=list)
    extensions: list[FieldDiff] = Field(default_factory=list)


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

    fields: list[FieldDiff] = Field(default_factory=list)
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
) -> list[FieldDiff]:
    """Leaf-level changes from ``old`` to ``new`` (the engine's field diff), values at or
    under the ``sensitive`` paths masked on both sides."""
    patterns = parse_patterns(sensitive)
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
        secret = sealed or touches(patterns, at)
        if sealed:
            shown_old = None if old_value is None else masked_value((), old_value, [[]])
            shown_new = None if new_value is None else masked_value((), new_value, [[]])
        else:
            shown_old = masked_value(at, old_value, patterns)
            shown_new = masked_value(at, new_value, patterns)
        out.append(
            FieldDiff(
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


def resource_diff(
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
        found = resource_diff(before.get(rid), after.get(rid), sensitive.get(rid, ()))
        if found is None:
            section.unchanged += 1
        else:
            section.resources.append(found)
    return section


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
        settings = field_changes(
            _spec_settings(old_spec), _spec_settings(new_spec), [CONTEXT_ENV, SET_SECRETS_PATH]
        )
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
    naming the part that is missing. Below a value masked as a whole (the
    ``SENSITIVE_MARKER`` a masked release holds) every path is that marker."""
    at: list[Segment] = []
    rest = path
    current = value
    while rest and current != SENSITIVE_MARKER:
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
    patterns = parse_patterns(sensitive.get(rid, ()))
    secret = touches(patterns, at) or value == SENSITIVE_MARKER
    if not show_sensitive:
        value = masked_value(at, value, patterns)
    return Lookup(id=rid, path=format_path(at), value=value, sensitive=secret)


def still_sealed(value: Any) -> bool:
    """Whether ``value`` holds a sealed envelope (its process had no keys to open it)."""
    return _holds_token(_seal_tokens(value))
