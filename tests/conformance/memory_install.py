"""Registers the test-only Memory runtime (tests/fixtures/memory_runtime) through the
``stackflow.runtimes`` entry-point group, the way installing its package would, without
installing anything: a ``dist-info`` with the package's entry point is written to a
temporary directory put on ``sys.path`` (where :mod:`importlib.metadata` finds it), next to
the package's source."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from stackflow.model.runtime_rules import ENTRY_POINT_GROUP, reload_runtimes

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "memory_runtime"


@contextlib.contextmanager
def memory_runtime_installed(where: Path) -> Iterator[None]:
    dist = where / "stackflow_memory_runtime-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: stackflow-memory-runtime\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nmemory = memory_runtime:RULES\n"
    )
    added = [str(where), str(SOURCE)]
    sys.path[:0] = added
    reload_runtimes()
    try:
        yield
    finally:
        for entry in added:
            sys.path.remove(entry)
        sys.modules.pop("memory_runtime", None)
        reload_runtimes()
