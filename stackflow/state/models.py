"""The state layer's small values and helpers: the run that may hold a stack, the lock,
content refs, URLs."""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from stackflow.core.errors import (
    SpecError,
)
from stackflow.core.refs import RunRef, StackFields
from stackflow.model.release import Operation

log = logging.getLogger(__name__)

REF_PREFIX = "sha256:"
MIGRATIONS = Path(__file__).with_name("migrations")
CHUNK = 500
"""Rows one statement names at most (``IN`` lists, multi-row upserts)."""


def now() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class StackLock(StackFields, BaseModel):
    """Who holds a stack: the release in progress and the run that writes it (a row of
    ``stack_locks``)."""

    project: str
    workspace: str
    revision: int
    operation: Operation
    workflow_id: str | None = None
    run_id: str | None = None
    acquired_at: datetime

    def held_by(self, run: RunRef | None) -> bool:
        if run is None:
            return self.run_id is None
        return self.run_id == run.run_id and self.workflow_id == run.workflow_id

    def holder(self) -> RunRef | None:
        if self.workflow_id is None or self.run_id is None:
            return None
        return RunRef(self.workflow_id, self.run_id)

    def describe(self) -> str:
        who = str(self.holder()) if self.holder() else "no recorded run"
        return f"release {self.revision} ({self.operation}) held by {who}"


def blob_ref(body: bytes) -> str:
    return REF_PREFIX + hashlib.sha256(body).hexdigest()


def check_ref(ref: str, kind: str) -> str:
    digest = ref[len(REF_PREFIX) :] if ref.startswith(REF_PREFIX) else ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise SpecError(f"{kind} {ref!r}: expected 'sha256:<64 hex digits>'")
    return ref


def default_state_url() -> str:
    """``$STACKFLOW_STATE_URL``, else SQLite at ``$STACKFLOW_HOME/state.db``."""
    url = os.environ.get("STACKFLOW_STATE_URL")
    if url:
        return url
    home = os.environ.get("STACKFLOW_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".stackflow"
    return f"sqlite:///{root / 'state.db'}"


def redact_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<invalid url>"


class RunKey(BaseModel):
    """A claim of a key: whether it was made for the same request, and the run its start
    made (None: not recorded yet, or the start did not happen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    same_request: bool
    workflow_id: str | None = None
    run_id: str | None = None
    created_at: datetime


class SourcePush(BaseModel):
    """The last commit a webhook delivery ran for a stack: from which repository, when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    commit: str
    at: datetime
