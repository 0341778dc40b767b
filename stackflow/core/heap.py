"""The heap of a long-running stackflow process (the worker, the API server) once it has
started.

CPython's cyclic collector walks every object of the generations it collects. A started
worker holds some 120,000 of them that live as long as it does (the Temporal SDK's, pydantic's
and SQLAlchemy's modules and schemas, stackflow's own, its clients), and each full collection
walked them all again: on a 200-resource Terraform preview, five full collections took about
40 ms each, inside the runs' activities. Frozen once started, they stay out of every later
collection, which then walks only what runs and requests made since.

Its threads (``asyncio.to_thread`` calls, the Temporal SDK's core, the state backend's
pool) each got a malloc arena of their own from glibc, up to eight per core, and memory freed
in one arena serves only that arena's later allocations: a worker's resident size grew with
the threads that had ever allocated, not with what it held. Two arenas are kept instead (the
setting ``MALLOC_ARENA_MAX=2`` makes, which wins when it is set): the worker's peak during a
10,000-ConfigMap apply, preview and destroy went from 269 / 369 MB to 241 / 341 MB, in the
same time.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Mapping

MALLOC_ARENAS = 2
"""glibc malloc arenas a long-running stackflow process allocates from."""
_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the arena limit (malloc.h)."""


def limit_malloc_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """At most :data:`MALLOC_ARENAS` arenas for this process, unless ``MALLOC_ARENA_MAX``
    sets them (glibc read it when the process started). Call first, before threads start.
    True when the C library took the setting; False elsewhere (not glibc: nothing to do)."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS))


def freeze_started() -> None:
    """Move every object alive now out of the collector's reach (after collecting what is
    already garbage): call once, when the process has started and before it takes work."""
    gc.collect()
    gc.freeze()
