"""Content-addressed storage of specs, so big specs never travel through workflow history.

A client stores the spec first and passes ``sha256:<hex>``; workers load it by that ref.
Files live under ``$STACKFLOW_HOME/specs/``; writes are atomic and idempotent.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from stackflow.blobs import BlobStore
from stackflow.errors import SpecError
from stackflow.spec import Resource, Spec, parse_spec


def _canonical(spec: Spec) -> bytes:
    data = spec.model_dump(mode="json", by_alias=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class SpecStore:
    """Stores specs by digest and hands them back (cached in memory per process)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = BlobStore(root, "spec_ref")

    def put(self, spec: Spec) -> str:
        return self.blobs.put(_canonical(spec))

    def get(self, ref: str) -> Spec:
        return _load(self.blobs.path(ref), ref)

    def resources(self, ref: str) -> dict[str, Resource]:
        """The spec's resources by id (cached with the spec)."""
        return _index(self.blobs.path(ref), ref)


@functools.lru_cache(maxsize=16)
def _load(path: Path, ref: str) -> Spec:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(
            f"spec_ref {ref}: not found under {path.parent}; store the spec first "
            "(stackflow stores it for you) or pass it inline as 'spec'"
        ) from None
    return parse_spec(json.loads(text), source=ref)


@functools.lru_cache(maxsize=16)
def _index(path: Path, ref: str) -> dict[str, Resource]:
    return {resource.id: resource for resource in _load(path, ref).resources}
