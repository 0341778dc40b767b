"""Content-addressed storage of operation plans, beside the spec store.

``prepare_operation`` derives the plan (every node with its deps and refs) once and stores
it as ``$STACKFLOW_HOME/plans/<sha256>.json``; preview activities and walk batches load the
ranges they need by ``plan_ref``, so the plan never travels through workflow history.
Writes are atomic and idempotent; reads are cached per process.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackflow.blobs import BlobStore
from stackflow.errors import SpecError
from stackflow.operation import PlannedNode


@dataclass(frozen=True)
class StoredPlan:
    nodes: list[PlannedNode]
    deletions: list[PlannedNode]
    node_index: dict[str, int]
    deletion_index: dict[str, int]

    def of(self, deletions: bool) -> list[PlannedNode]:
        return self.deletions if deletions else self.nodes

    def index_of(self, deletions: bool) -> dict[str, int]:
        return self.deletion_index if deletions else self.node_index


def _row(node: PlannedNode) -> list[object]:
    return [node.id, node.type, node.deps, [list(r) for r in node.refs]]


class PlanStore:
    def __init__(self, root: Path) -> None:
        self.blobs = BlobStore(root, "plan_ref")

    def put(self, nodes: list[PlannedNode], deletions: list[PlannedNode]) -> str:
        data = {"nodes": [_row(n) for n in nodes], "deletions": [_row(n) for n in deletions]}
        return self.blobs.put(json.dumps(data, separators=(",", ":")).encode())

    def get(self, ref: str) -> StoredPlan:
        return _load(self.blobs.path(ref), ref)


def _nodes(rows: list[list[Any]]) -> list[PlannedNode]:
    return [
        PlannedNode.model_construct(
            id=row[0],
            type=row[1],
            action="Apply",
            deps=list(row[2]),
            refs=[(str(rid), str(path)) for rid, path in row[3]],
        )
        for row in rows
    ]


@functools.lru_cache(maxsize=8)
def _load(path: Path, ref: str) -> StoredPlan:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SpecError(f"plan_ref {ref}: not found under {path.parent}") from None
    nodes = _nodes(data["nodes"])
    deletions = _nodes(data["deletions"])
    return StoredPlan(
        nodes=nodes,
        deletions=deletions,
        node_index={n.id: i for i, n in enumerate(nodes)},
        deletion_index={n.id: i for i, n in enumerate(deletions)},
    )
