"""Where stackflow keeps its local things: the embedded database and the worker's caches under
``STACKFLOW_HOME``. The state backend itself (``STACKFLOW_STATE_URL``) is opened by
:func:`stackflow.state.backend.open_backend`."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def stackflow_home() -> Path:
    """``$STACKFLOW_HOME``, default ``~/.stackflow``: the embedded SQLite database and the
    worker's caches (Terraform working dirs). Nothing is created until a write."""
    return _home(os.environ.get("STACKFLOW_HOME"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=16)
def _home(value: str | None, home: str | None) -> Path:
    """``stackflow_home`` for these two variables (asked for on every Terraform call)."""
    return Path(value).expanduser() if value else Path.home() / ".stackflow"
