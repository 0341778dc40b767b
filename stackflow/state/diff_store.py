"""Full preview diffs in the state backend, and how a run refers to them.

Each preview batch keeps its whole diff (every field, whole values; sensitive ones already
masked) as one blob and returns its ref. A run holds those refs in its view, result and
release; past :data:`DIFF_REFS_LIMIT` of them the workflow folds them into one *index* blob
that lists them (indexes may list indexes), so what a run carries in Temporal history stays
a few refs whatever the size of the stack. Readers expand indexes with :func:`load_changes`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stackflow.core.errors import SpecError

if TYPE_CHECKING:
    from stackflow.engine.diff import Change
    from stackflow.state.backend import StateBackend

DIFF_KIND = "diff_ref"
DIFF_REFS_LIMIT = 16
"""Diff refs a run holds at most before folding them into one index."""
_MAX_DEPTH = 32


def put_changes(backend: StateBackend, changes: Sequence[Change]) -> str:
    """The whole changes (every field, whole values; sensitive ones already masked)."""
    data = [change.model_dump(mode="json") for change in changes]
    body = json.dumps(data, separators=(",", ":"), default=str).encode()
    return backend.put_blob(DIFF_KIND, body)


def put_index(backend: StateBackend, refs: list[str]) -> str:
    """One ref standing for ``refs``, in order."""
    body = json.dumps({"index": refs}, separators=(",", ":")).encode()
    return backend.put_blob(DIFF_KIND, body)


def load_changes(backend: StateBackend, refs: list[str]) -> list[dict[str, Any]]:
    """Every change the refs hold, in order, indexes expanded."""
    changes: list[dict[str, Any]] = []

    def walk(ref: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise SpecError(f"{DIFF_KIND} {ref}: indexes nested more than {_MAX_DEPTH} deep")
        doc = json.loads(backend.get_blob(DIFF_KIND, ref))
        if isinstance(doc, dict):
            for inner in doc.get("index") or []:
                walk(str(inner), depth + 1)
        else:
            changes.extend(doc)

    for ref in refs:
        walk(ref, 0)
    return changes
