"""Content-addressed storage of specs, so big specs never travel through workflow history.

A client stores the spec first and passes ``sha256:<hex>``; workers load it by that ref.
Files live under ``$STACKFLOW_HOME/specs/``; writes are atomic and idempotent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from stackflow.errors import SpecError
from stackflow.spec import Resource, Spec, parse_spec

REF_PREFIX = "sha256:"


def _canonical(spec: Spec) -> bytes:
    data = spec.model_dump(mode="json", by_alias=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class SpecStore:
    """Stores specs by digest and hands them back (cached in memory per process)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, ref: str) -> Path:
        if not ref.startswith(REF_PREFIX) or len(ref) != len(REF_PREFIX) + 64:
            raise SpecError(f"spec_ref {ref!r}: expected 'sha256:<64 hex digits>'")
        digest = ref[len(REF_PREFIX) :]
        if any(c not in "0123456789abcdef" for c in digest):
            raise SpecError(f"spec_ref {ref!r}: expected 'sha256:<64 hex digits>'")
        return self.root / f"{digest}.json"

    def put(self, spec: Spec) -> str:
        body = _canonical(spec)
        ref = REF_PREFIX + hashlib.sha256(body).hexdigest()
        path = self._path(ref)
        if path.exists():
            return ref
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".spec-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return ref

    def get(self, ref: str) -> Spec:
        return _load(self._path(ref), ref)

    def resources(self, ref: str) -> dict[str, Resource]:
        """The spec's resources by id (cached with the spec)."""
        return _index(self._path(ref), ref)


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
