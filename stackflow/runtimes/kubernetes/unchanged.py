"""Whether a server-side apply would change nothing: a preview that needs no dry run.

A server-side apply of configuration ``C`` by field manager ``M`` to a live object ``L``
changes ``L`` only when

1. a field ``C`` sets holds another value in ``L``, or
2. the fields ``M`` owns in ``L`` (its ``Apply`` entry of ``metadata.managedFields``) are not
   exactly the fields of ``C``: fields ``M`` owned that ``C`` no longer sets are removed,
   fields ``C`` newly sets become ``M``'s.

When neither holds the apply is a no-op (the server does not even write a new
``resourceVersion``), and its dry run would answer ``L`` itself: :func:`applies_unchanged`
says so from ``L`` alone, one request fewer per unchanged object, the API server spared the
apply's admission and merge.

Only what can be decided without the kind's schema is decided here; anything else is left to
the dry run (a ``False`` answer costs the request, never a wrong preview):

- ``C``'s field set is computable only for maps and scalars: a list's fields depend on its
  merge type (atomic, set, or map with keys), which only the schema knows, so a
  configuration holding a list, a null or a ``status`` goes to the dry run. A map the schema
  makes atomic is owned as one field (``f:selector: {}``), which never equals the set
  computed from its entries: the dry run again.
- An empty map in ``C`` is unchanged only if ``L`` holds an empty map there too (an atomic
  empty map would replace whatever ``L`` holds).
- Scalars compare by value and JSON type (``1`` is not ``1.0`` nor ``true``).
- ``apiVersion``, ``kind``, ``metadata.name`` and ``metadata.namespace`` identify the object
  and are never in a field set; other ``metadata`` than ``labels`` and ``annotations`` goes
  to the dry run. The entry must be of the configuration's ``apiVersion``.
- An object being deleted is not decided here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stackflow.runtimes.kubernetes.manifest import FIELD_MANAGER

_IDENTITY = frozenset({"apiVersion", "kind"})
_METADATA_IDENTITY = frozenset({"name", "namespace"})
_METADATA_OWNED = frozenset({"labels", "annotations"})


class _Undecided(Exception):
    """The configuration holds what only the schema (or the dry run) can decide."""


def applies_unchanged(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether server-side applying ``desired`` (as :data:`FIELD_MANAGER`) to ``live`` (the
    object as a GET or LIST answers it, with its ``managedFields``) would change nothing."""
    metadata = live.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("deletionTimestamp"):
        return False
    entry = _apply_entry(metadata.get("managedFields"), desired.get("apiVersion"))
    if entry is None:
        return False
    try:
        fields = _configuration_fields(desired)
        _same_values(desired, live, top=True)
    except _Undecided:
        return False
    return bool(fields == entry)


def _apply_entry(entries: Any, api_version: Any) -> Any:
    """The fields stackflow's Apply entry owns, or None when there is no single such entry
    of ``api_version`` (fieldsV1 form)."""
    if not isinstance(entries, list):
        return None
    found = [
        e
        for e in entries
        if isinstance(e, Mapping)
        and e.get("manager") == FIELD_MANAGER
        and e.get("operation") == "Apply"
        and not e.get("subresource")
    ]
    if len(found) != 1:
        return None
    entry = found[0]
    if entry.get("apiVersion") != api_version or entry.get("fieldsType") != "FieldsV1":
        return None
    fields = entry.get("fieldsV1")
    return fields if isinstance(fields, Mapping) else None


def _configuration_fields(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The field set (fieldsV1 form) a server-side apply of ``desired`` gives its manager."""
    out: dict[str, Any] = {}
    for key, value in desired.items():
        if key in _IDENTITY:
            continue
        if key == "status":
            raise _Undecided
        if key == "metadata":
            if not isinstance(value, Mapping):
                raise _Undecided
            owned = {}
            for mkey, mvalue in value.items():
                if mkey in _METADATA_IDENTITY:
                    continue
                if mkey not in _METADATA_OWNED:
                    raise _Undecided
                owned[f"f:{mkey}"] = _fields(mvalue)
            if owned:
                out["f:metadata"] = owned
            continue
        out[f"f:{key}"] = _fields(value)
    return out


def _fields(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {f"f:{k}": _fields(v) for k, v in value.items()}
    if value is None or isinstance(value, list):
        raise _Undecided
    return {}


def _same_values(desired: Any, live: Any, *, top: bool = False) -> None:
    """Raise :class:`_Undecided` unless every field ``desired`` sets holds the same value in
    ``live`` (at the top, the identity fields were already matched by the read)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping) or (not desired and live):
            raise _Undecided
        for key, value in desired.items():
            if top and key in _IDENTITY:
                continue
            if key not in live:
                raise _Undecided
            _same_values(value, live[key])
        return
    if type(desired) is not type(live) or desired != live:
        raise _Undecided
