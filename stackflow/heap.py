"""The heap of a long-running stackflow process (the worker, the API server) once it has
started.

CPython's cyclic collector walks every object of the generations it collects. A started
worker holds some 120,000 of them that live as long as it does (the Temporal SDK's, pydantic's
and SQLAlchemy's modules and schemas, stackflow's own, its clients), and each full collection
walked them all again: on a 200-resource Terraform preview, five full collections took about
40 ms each, inside the runs' activities. Frozen once started, they stay out of every later
collection, which then walks only what runs and requests made since.
"""

from __future__ import annotations

import gc


def freeze_started() -> None:
    """Move every object alive now out of the collector's reach (after collecting what is
    already garbage): call once, when the process has started and before it takes work."""
    gc.collect()
    gc.freeze()
