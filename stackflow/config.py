"""Where stackflow keeps its files."""

from __future__ import annotations

import os
from pathlib import Path

from stackflow.release import ReleaseStore
from stackflow.store.filesystem import FileRecordStore


def stackflow_home() -> Path:
    """``$STACKFLOW_HOME``, default ``~/.stackflow``. Nothing is created until a write."""
    value = os.environ.get("STACKFLOW_HOME")
    return Path(value).expanduser() if value else Path.home() / ".stackflow"


def default_release_store() -> ReleaseStore:
    """Releases under ``$STACKFLOW_HOME/releases/<project>/<workspace>/<revision>.yaml``."""
    return ReleaseStore(FileRecordStore(stackflow_home()))
