"""Content-addressed blobs on disk: ``<root>/<sha256>.json``, referred to as ``sha256:<hex>``.

Specs and plans are stored this way so they never travel through workflow history. Writes
are atomic (temp file, fsync, rename) and idempotent: the same bytes give the same ref.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from stackflow.errors import SpecError

REF_PREFIX = "sha256:"


class BlobStore:
    """Stores bytes by digest; ``kind`` names them in errors (``spec_ref``, ``plan_ref``)."""

    def __init__(self, root: Path, kind: str) -> None:
        self.root = root
        self.kind = kind

    def path(self, ref: str) -> Path:
        digest = ref[len(REF_PREFIX) :] if ref.startswith(REF_PREFIX) else ""
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise SpecError(f"{self.kind} {ref!r}: expected 'sha256:<64 hex digits>'")
        return self.root / f"{digest}.json"

    def put(self, body: bytes) -> str:
        ref = REF_PREFIX + hashlib.sha256(body).hexdigest()
        path = self.path(ref)
        if path.exists():
            return ref
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".blob-")
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
