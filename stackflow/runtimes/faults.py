"""Fault injection for crash tests: ``STACKFLOW_FAULT=<point>:<resource id>`` makes the
worker process exit at once (as SIGKILL would) when it reaches that point for that resource.
Set only by tests on their own worker processes; unset, it costs one dict lookup."""

from __future__ import annotations

import os
import sys


def fault_point(point: str, resource_id: str) -> None:
    wanted = os.environ.get("STACKFLOW_FAULT")
    if wanted and wanted == f"{point}:{resource_id}":
        sys.stderr.write(f"STACKFLOW_FAULT: exiting at {point} for {resource_id}\n")
        sys.stderr.flush()
        os._exit(137)
