"""Terraform state and plan documents: which state wins, values, sensitive paths.

stackflow keeps each resource's Terraform state in the release (the attributes the runtime
returns carry it under :data:`STATE_KEY`); the working directory is a cache. Before every
command the state is seeded from the release, unless the working directory holds a newer
serial of the same lineage (an apply that finished but was not recorded yet, say).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from stackflow.core.paths import Segment, format_path

STATE_KEY = "_stackflow_tfstate"
"""Reserved attribute holding the resource's Terraform state (a compact JSON string)."""
SENSITIVE_KEY = "_stackflow_sensitive"
"""Reserved attribute listing the paths whose values are sensitive."""
RESERVED_KEYS = (STATE_KEY, SENSITIVE_KEY)
UNKNOWN = "(known after apply)"

State = dict[str, Any]

# The built-in provider is not in ``providers schema -json``; terraform_data's schema is fixed.
BUILTIN_SCHEMAS: dict[str, dict[str, Any]] = {
    "terraform_data": {
        "attributes": {
            "id": {"type": "string", "computed": True},
            "input": {"type": "dynamic", "optional": True},
            "output": {"type": "dynamic", "computed": True},
            "triggers_replace": {"type": "dynamic", "optional": True},
        }
    }
}


def recorded_state(prior: Mapping[str, Any] | None) -> State | None:
    """The Terraform state stackflow recorded for the resource, if any."""
    if not prior:
        return None
    raw = prior.get(STATE_KEY)
    if isinstance(raw, str):
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None
    return raw if isinstance(raw, dict) else None


def choose_state(recorded: State | None, local: State | None) -> State | None:
    """The state to act on: the release's, unless the cache holds a newer one of its lineage.

    Without a recorded state, a local state that still tracks an object wins: an earlier
    attempt created it and did not get to record it (its activity will be retried).
    """
    if recorded is None:
        return local if local is not None and instance(local) is not None else None
    if (
        local is not None
        and local.get("lineage") == recorded.get("lineage")
        and int(local.get("serial", 0)) > int(recorded.get("serial", 0))
    ):
        return local
    return recorded


def newest(first: State | None, second: State | None) -> State | None:
    """Of two candidate states, the newer serial of one lineage; across lineages, ``first``."""
    if first is None or second is None:
        return first if first is not None else second
    if first.get("lineage") == second.get("lineage") and int(second.get("serial", 0)) > int(
        first.get("serial", 0)
    ):
        return second
    return first


def managed_by_address(state: Mapping[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """``state``'s managed resources by address (``type.name``), in order: a batch reads its
    merged state's members from it, where looking each one up would scan the whole state
    once per member."""
    found: dict[str, list[dict[str, Any]]] = {}
    for res in (state or {}).get("resources") or []:
        if res.get("mode") == "managed":
            found.setdefault(f"{res.get('type')}.{res.get('name')}", []).append(res)
    return found


def instance(state: State | None, address: str | None = None) -> dict[str, Any] | None:
    """The single managed resource instance in ``state`` (stackflow keeps one per state)."""
    if not state:
        return None
    for res in state.get("resources") or []:
        if res.get("mode") != "managed":
            continue
        if address is not None and f"{res.get('type')}.{res.get('name')}" != address:
            continue
        for inst in res.get("instances") or []:
            if inst.get("index_key") is None:
                return dict(inst, type=res.get("type"), name=res.get("name"))
    return None


# ---- values ---------------------------------------------------------------------------------
def _decode(value: Any, type_expr: Any) -> Any:
    """A state value with its dynamic parts unwrapped (state stores them as {value, type})."""
    if value is None:
        return None
    if type_expr == "dynamic":
        if isinstance(value, dict) and set(value) == {"value", "type"}:
            return value["value"]
        return value
    if isinstance(type_expr, list) and len(type_expr) == 2:
        kind, inner = type_expr
        if kind in ("list", "set") and isinstance(value, list):
            return [_decode(v, inner) for v in value]
        if kind == "map" and isinstance(value, dict):
            return {k: _decode(v, inner) for k, v in value.items()}
        if kind == "object" and isinstance(value, dict) and isinstance(inner, dict):
            return {k: _decode(v, inner.get(k)) for k, v in value.items()}
        if kind == "tuple" and isinstance(value, list) and isinstance(inner, list):
            return [_decode(v, inner[i] if i < len(inner) else None) for i, v in enumerate(value)]
    return value


def _has_dynamic(node: Any) -> bool:
    if node == "dynamic":
        return True
    if isinstance(node, dict):
        return any(_has_dynamic(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_dynamic(v) for v in node)
    return False


def _decode_nested(value: Any, nesting: str, block: Mapping[str, Any]) -> Any:
    """A nested block or nested attribute: one object, or a list/set/map of them."""
    if value is None:
        return None
    if nesting in ("list", "set") and isinstance(value, list):
        return [decode_block(v, block) if isinstance(v, dict) else v for v in value]
    if nesting == "map" and isinstance(value, dict):
        return {k: decode_block(v, block) if isinstance(v, dict) else v for k, v in value.items()}
    return decode_block(value, block) if isinstance(value, dict) else value


def decode_block(values: Mapping[str, Any], block: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values of a state instance, shaped as ``show -json`` renders them."""
    if not _has_dynamic(block):
        return dict(values)
    attrs = block.get("attributes") or {}
    blocks = block.get("block_types") or {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in attrs and "nested_type" in attrs[key]:
            nested = attrs[key]["nested_type"]
            out[key] = _decode_nested(value, nested.get("nesting_mode", "single"), nested)
        elif key in attrs:
            out[key] = _decode(value, attrs[key].get("type"))
        elif key in blocks:
            spec = blocks[key]
            out[key] = _decode_nested(
                value, spec.get("nesting_mode", "single"), spec.get("block") or {}
            )
        else:
            out[key] = value
    return out


# ---- sensitive paths ------------------------------------------------------------------------
def schema_sensitive_paths(block: Mapping[str, Any], at: tuple[Segment, ...] = ()) -> Iterator[str]:
    """Paths the provider's schema marks sensitive."""
    for key, spec in (block.get("attributes") or {}).items():
        if spec.get("sensitive"):
            yield format_path((*at, key))
    for key, spec in (block.get("block_types") or {}).items():
        sub = spec.get("block") or {}
        if any(a.get("sensitive") for a in (sub.get("attributes") or {}).values()):
            # nested block contents: mark the whole block (indices are not known statically)
            yield format_path((*at, key))


def state_sensitive_paths(inst: Mapping[str, Any], block: Mapping[str, Any] | None) -> list[str]:
    """Paths marked sensitive in the instance (``sensitive_attributes``) or by the schema."""
    paths: set[str] = set()
    for steps in inst.get("sensitive_attributes") or []:
        segs: list[Segment] = []
        for step in steps:
            value = step.get("value")
            if step.get("type") == "get_attr" and isinstance(value, str):
                segs.append(value)
            elif isinstance(value, dict) and "value" in value:
                key = value["value"]
                segs.append(int(key) if isinstance(key, int | float) else str(key))
            else:
                break
        if segs:
            paths.add(format_path(segs))
    if block:
        paths.update(schema_sensitive_paths(block))
    return sorted(paths)


def marked_paths(tree: Any, at: tuple[Segment, ...] = ()) -> Iterator[tuple[Segment, ...]]:
    """Paths where a plan's ``after_sensitive``/``after_unknown`` tree is ``true``."""
    if tree is True:
        yield at
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from marked_paths(value, (*at, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from marked_paths(value, (*at, index))


def with_unknowns(after: Any, unknown: Any) -> Any:
    """``after`` with every value the plan cannot know yet shown as :data:`UNKNOWN`."""
    if unknown is True:
        return UNKNOWN
    if isinstance(unknown, dict):
        base = dict(after) if isinstance(after, dict) else {}
        for key, sub in unknown.items():
            base[key] = with_unknowns(base.get(key), sub)
        return base
    if isinstance(unknown, list) and isinstance(after, list):
        return [
            with_unknowns(item, unknown[i]) if i < len(unknown) else item
            for i, item in enumerate(after)
        ]
    return after


def resource_changes(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan's managed resource changes by address (the first of each)."""
    found: dict[str, dict[str, Any]] = {}
    for change in plan.get("resource_changes") or []:
        if change.get("mode", "managed") == "managed":
            found.setdefault(change.get("address"), change)
    return found


def resource_change(plan: Mapping[str, Any], address: str) -> dict[str, Any] | None:
    change = resource_changes(plan).get(address)
    return dict(change) if change is not None else None


def planned_lives(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each object as the plan's refresh found it, by address (absent: not tracked, or
    gone)."""
    root = ((plan.get("prior_state") or {}).get("values") or {}).get("root_module") or {}
    found: dict[str, dict[str, Any]] = {}
    for res in root.get("resources") or []:
        if res.get("mode", "managed") == "managed" and res.get("address") not in found:
            values = res.get("values")
            found[res.get("address")] = dict(values) if isinstance(values, dict) else {}
    return found


def planned_live(plan: Mapping[str, Any], address: str) -> dict[str, Any] | None:
    """The object as the plan's refresh found it (None: not tracked, or gone)."""
    return planned_lives(plan).get(address)


def compact(state: State) -> str:
    return json.dumps(state, separators=(",", ":"), sort_keys=True)
