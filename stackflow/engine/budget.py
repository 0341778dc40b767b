"""Byte budgets for what enters Temporal history: activity results, workflow results and
query answers stay under ``BUDGET`` encoded bytes whatever the size or number of resources.

Long values in diffs are shortened (their size and digest are shown instead), a resource
keeps at most ``ENTRIES`` field changes, and past the budget whole diffs are summarised per
resource (``diff_omitted``). The full diffs stay in the state backend (``diff_refs``) for
``stackflow preview --full`` and ``stackflow release show --diff``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stackflow.engine.diff import Change

BUDGET = 256 * 1024
"""The most one result or query answer may take (JSON bytes)."""
VALUE_LIMIT = 512
"""Characters of one shown value; longer ones are shortened."""
ENTRIES = 50
"""Field changes shown per resource; the rest are counted."""
ERROR_LIMIT = 2000
"""Characters of one node's error."""


def size_of(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False).encode())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def shorten(value: Any, limit: int = VALUE_LIMIT) -> Any:
    """``value``, or for a long one a string saying what it was: its start, size and digest."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) <= limit:
        return value
    kind = "" if isinstance(value, str) else f"{type(value).__name__} "
    return f"{text[:120]}… ({kind}{len(text.encode())} bytes, sha256:{_digest(text)})"


def short_error(error: str | None) -> str | None:
    if error is None or len(error) <= ERROR_LIMIT:
        return error
    return f"{error[: ERROR_LIMIT - 60]}… ({len(error)} characters in all)"


def fit_errors(results: list[Any], budget: int = BUDGET // 2) -> list[Any]:
    """Node results (``.error`` strings) within ``budget``: past it, every error is cut to an
    equal share, so up to DETAIL_LIMIT failures never take a result past the budget."""
    used = sum(len(r.error or "") for r in results)
    if used <= budget:
        return results
    room = max(120, budget // max(len(results), 1))
    return [
        r.model_copy(update={"error": short_error_to(r.error, room)}) if r.error else r
        for r in results
    ]


def short_error_to(error: str, limit: int) -> str:
    return error if len(error) <= limit else f"{error[: limit - 20]}… ({len(error)} chars)"


def compact_change(change: Change, *, diff_omitted: bool = False) -> dict[str, Any]:
    """A change as history keeps it: long values shortened, at most ``ENTRIES`` field
    changes (``diff_more`` counts the rest), ``diff_omitted`` when its diff was left out."""
    diff = change.diff
    out = change.model_dump(mode="json", exclude={"diff"})
    out["diff"] = [
        {**entry.model_dump(mode="json"), "old": shorten(entry.old), "new": shorten(entry.new)}
        for entry in diff[:ENTRIES]
    ]
    if len(diff) > ENTRIES:
        out["diff_more"] = len(diff) - ENTRIES
    if diff_omitted:
        out["diff_omitted"] = True
    return out


def fit_changes(changes: Iterable[dict[str, Any]], budget: int = BUDGET) -> list[dict[str, Any]]:
    """The changes, their diffs dropped (``diff_omitted``) from the first one that would take
    the list past ``budget``; ids, types and actions are always kept."""
    out: list[dict[str, Any]] = []
    used = 0
    for change in changes:
        size = size_of(change)
        if used + size > budget and change.get("diff"):
            change = {k: v for k, v in change.items() if k not in ("diff", "diff_more")}
            change["diff"] = []
            change["diff_omitted"] = True
            size = size_of(change)
        used += size
        out.append(change)
    return out
