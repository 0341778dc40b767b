"""``--target`` and ``--exclude``: which resources an operation touches.

Patterns are shell globs (``fnmatch``, case-sensitive) on resource ids; each flag repeats.

- Resources the spec applies: ``--target`` keeps the matched resources and everything they
  depend on (they cannot be applied without it); ``--exclude`` leaves out the matched
  resources and everything that depends on them (it may need what was left out).
- Resources being deleted (destroy, or gone from the spec): ``--target`` deletes the matched
  ones and the resources that depend on them (those must go first); ``--exclude`` keeps the
  matched ones and what they depend on (it cannot be deleted from under them).

Whatever is left out keeps its recorded state unchanged in the new release.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from stackflow.core.errors import SpecError
from stackflow.engine.graph import Graph

LEFT_OUT_LIMIT = 50
"""Left-out resources named in a plan (and so in history); the rest are only counted."""


class LeftOutReason(StrEnum):
    not_targeted = "not targeted"
    excluded = "excluded"
    depends_on_excluded = "depends on an excluded resource"
    dependency_of_excluded = "an excluded resource depends on it"


class LeftOut(BaseModel):
    id: str
    reason: LeftOutReason
    via: str | None = None
    """The matched resource the reason comes from (for the dependency reasons)."""


class Selection(BaseModel):
    """The ``targets`` / ``excludes`` of a request, checked."""

    targets: list[str] = Field(default_factory=list)
    excludes: list[str] = Field(default_factory=list)

    @property
    def everything(self) -> bool:
        return not self.targets and not self.excludes


class Selected(BaseModel):
    """What a selection kept of one set of ids, and what it left out (capped)."""

    kept: set[str]
    left_out: list[LeftOut] = Field(default_factory=list)
    left_out_count: int = 0


def _matching(patterns: Sequence[str], ids: Iterable[str]) -> set[str]:
    return {rid for rid in ids if any(fnmatch.fnmatchcase(rid, p) for p in patterns)}


def _closure(start: Iterable[str], step: Callable[[str], list[str]]) -> dict[str, str]:
    """Every id reachable from ``start`` through ``step``, with the start id it came from."""
    origin = {rid: rid for rid in start}
    todo = list(origin)
    while todo:
        rid = todo.pop()
        for nxt in step(rid):
            if nxt not in origin:
                origin[nxt] = origin[rid]
                todo.append(nxt)
    return origin


def check_patterns(selection: Selection, ids: Iterable[str]) -> None:
    """A pattern that matches nothing is a mistake (a typo would silently do everything or
    nothing): SpecError naming the flag and the pattern."""
    every = list(ids)
    for flag, patterns in (("--target", selection.targets), ("--exclude", selection.excludes)):
        for pattern in patterns:
            if not pattern:
                raise SpecError(f"{flag}: an empty pattern; give a resource id or a glob")
            if not _matching([pattern], every):
                raise SpecError(
                    f"{flag} {pattern}: matches no resource of the stack; list the ids with "
                    "`stackflow graph -f SPEC` or `stackflow output`"
                )


def select(graph: Graph, selection: Selection, *, deleting: bool = False) -> Selected:
    """Apply ``selection`` to ``graph`` (the spec's graph, or for ``deleting`` the recorded
    resources' graph: edges point from a resource to what it depends on in both)."""
    ids = list(graph.ids)
    if selection.everything:
        return Selected(kept=set(ids))
    reasons: dict[str, LeftOut] = {}
    kept = set(ids)
    if selection.targets:
        matched = _matching(selection.targets, ids)
        wanted = _closure(matched, graph.dependents if deleting else graph.dependencies)
        for rid in ids:
            if rid not in wanted:
                reasons[rid] = LeftOut(id=rid, reason=LeftOutReason.not_targeted)
        kept = set(wanted)
    if selection.excludes:
        matched = _matching(selection.excludes, ids)
        spread = _closure(matched, graph.dependencies if deleting else graph.dependents)
        spread_reason = (
            LeftOutReason.dependency_of_excluded if deleting else LeftOutReason.depends_on_excluded
        )
        for rid, via in spread.items():
            if rid in kept:
                kept.discard(rid)
                reasons[rid] = (
                    LeftOut(id=rid, reason=LeftOutReason.excluded)
                    if rid == via
                    else LeftOut(id=rid, reason=spread_reason, via=via)
                )
    left = [reasons[rid] for rid in ids if rid in reasons]
    return Selected(kept=kept, left_out=left[:LEFT_OUT_LIMIT], left_out_count=len(left))
