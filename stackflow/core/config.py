"""Where stackflow keeps its things: the state backend (``STACKFLOW_STATE_URL``) and the
worker's local caches under ``STACKFLOW_HOME``."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the backend (SQLAlchemy) is imported by what opens it, not by the CLI's start
    from stackflow.state.backend import StateBackend


def stackflow_home() -> Path:
    """``$STACKFLOW_HOME``, default ``~/.stackflow``: the embedded SQLite database and the
    worker's caches (Terraform working dirs). Nothing is created until a write."""
    return _home(os.environ.get("STACKFLOW_HOME"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=16)
def _home(value: str | None, home: str | None) -> Path:
    """``stackflow_home`` for these two variables (asked for on every Terraform call)."""
    return Path(value).expanduser() if value else Path.home() / ".stackflow"


def state_url() -> str:
    from stackflow.state.backend import default_state_url

    return default_state_url()


def default_backend(*, migrate: bool = False) -> StateBackend:
    """The state backend ``STACKFLOW_STATE_URL`` names (default: SQLite in the home)."""
    from stackflow.state.backend import open_backend

    return open_backend(state_url(), migrate=migrate)
