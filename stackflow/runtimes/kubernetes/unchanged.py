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

A field's merge type is the schema's, which is not at hand; the entry itself shows how the
server merged the last apply, and ``C``'s field set is computed the way the entry reads
(anything else is left to the dry run: a ``False`` answer costs the request, never a wrong
preview):

- a map is owned field by field (``f:labels: {f:app: {}}``), or whole when the schema makes
  it atomic (``f:selector: {}``): then ``L`` must hold exactly ``C``'s map;
- a list is owned whole (atomic, ``f:args: {}``: ``L`` must hold exactly ``C``'s list), as a
  set (``v:<value>`` each: exactly ``C``'s list again), or as a map of items by key
  (``k:{"name":"web"}``: the item at each position of ``L`` holds every field ``C``'s item
  at that position sets, the key's fields read from ``L``'s item, since a key field may be
  one the server defaulted, as a port's ``protocol``);
- lists hold ``C``'s items in ``C``'s order, no more; an empty list, a null or a ``status``
  goes to the dry run;
- an empty map in ``C`` is unchanged only if ``L`` holds an empty map there too;
- scalars compare by value and JSON type (``1`` is not ``1.0`` nor ``true``).
- ``apiVersion``, ``kind``, ``metadata.name`` and ``metadata.namespace`` identify the object
  and are never in a field set; other ``metadata`` than ``labels`` and ``annotations`` goes
  to the dry run. The entry must be of the configuration's ``apiVersion``.
- An object being deleted is not decided here.
"""

from __future__ import annotations

import json
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
        fields = _configuration_fields(desired, live, entry)
    except _Undecided:
        return False
    return bool(fields == entry)


def _apply_entry(entries: Any, api_version: Any) -> Mapping[str, Any] | None:
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


def _configuration_fields(
    desired: Mapping[str, Any], live: Mapping[str, Any], entry: Mapping[str, Any]
) -> dict[str, Any]:
    """The field set (fieldsV1 form) a server-side apply of ``desired`` gives its manager,
    read as ``entry`` reads; :class:`_Undecided` unless ``live`` holds every value."""
    out: dict[str, Any] = {}
    for key, value in desired.items():
        if key in _IDENTITY:
            continue
        if key == "status" or key not in live:
            raise _Undecided
        if key == "metadata":
            if not isinstance(value, Mapping) or not isinstance(live[key], Mapping):
                raise _Undecided
            owned = {}
            below = _below(entry, "f:metadata")
            for mkey, mvalue in value.items():
                if mkey in _METADATA_IDENTITY:
                    continue
                if mkey not in _METADATA_OWNED or mkey not in live[key]:
                    raise _Undecided
                name = f"f:{mkey}"
                owned[name] = _owned(mvalue, live[key][mkey], _below(below, name))
            if owned:
                out["f:metadata"] = owned
            continue
        out[f"f:{key}"] = _owned(value, live[key], _below(entry, f"f:{key}"))
    return out


def _below(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, Mapping) else None


def _owned(config: Any, live: Any, entry: Any) -> dict[str, Any]:
    """The fields ``config`` (a value of the configuration) gives its manager, read as
    ``entry`` (what the entry holds at the same place, if anything) reads."""
    if isinstance(config, Mapping):
        if not isinstance(live, Mapping) or (not config and live):
            raise _Undecided
        if config and entry == {}:  # an atomic map, replaced whole
            _same(config, live)
            return {}
        out = {}
        for key, value in config.items():
            if key not in live:
                raise _Undecided
            name = f"f:{key}"
            out[name] = _owned(value, live[key], _below(entry, name))
        return out
    if isinstance(config, list):
        if not config or not isinstance(entry, Mapping):
            raise _Undecided
        if not entry or all(name.startswith("v:") for name in entry):  # atomic, or a set
            _same(config, live)
            return {} if not entry else {f"v:{_json(item)}": {} for item in config}
        return _keyed_items(config, live, entry)
    if config is None:
        raise _Undecided
    _same(config, live)
    return {}


def _keyed_items(config: list[Any], live: Any, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A list of items by key (``k:{...}`` entries), position by position with ``live``."""
    if not isinstance(live, list) or len(live) != len(config):
        raise _Undecided
    try:
        keys = {tuple(sorted(json.loads(name[2:]))) for name in entry if name.startswith("k:")}
    except (ValueError, TypeError):
        raise _Undecided from None
    if len(keys) != 1 or any(not name.startswith("k:") for name in entry):
        raise _Undecided
    (fields,) = keys
    out: dict[str, Any] = {}
    for item, held in zip(config, live, strict=True):
        if not isinstance(item, Mapping) or not isinstance(held, Mapping):
            raise _Undecided
        if any(f not in held or (f in item and not _equal(item[f], held[f])) for f in fields):
            raise _Undecided
        name = "k:" + _json({f: held[f] for f in fields})
        if name in out:
            raise _Undecided
        out[name] = {".": {}, **_owned(item, held, _below(entry, name))}
    return out


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _same(config: Any, live: Any) -> None:
    if not _equal(config, live):
        raise _Undecided


def _equal(a: Any, b: Any) -> bool:
    """Equal values of equal JSON types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
