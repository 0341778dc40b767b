"""Drift: what a ``DriftWorkflow`` found when it read a stack's resources and compared them
with the recorded state and the last spec. Reports are kept in the state backend; the
workflow's history holds only the summary and the report's ref."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from stackflow.core.errors import SpecError
from stackflow.core.refs import StackFields, StackRef


class DriftSummary(BaseModel):
    """Counts of a check: what a scheduled run's result and the search attribute need."""

    checked: int = 0
    """Resources read."""
    drifted: int = 0
    """Live object differs from the recorded state (changed behind stackflow's back)."""
    missing: int = 0
    """Recorded, but gone from the infrastructure."""
    pending: int = 0
    """The last spec would still change the resource (live ≠ desired, not drift)."""
    ids: list[str] = Field(default_factory=list)
    """The first drifted/missing resource ids (at most ``DRIFT_ID_LIMIT``)."""


DRIFT_ID_LIMIT = 20


class DriftReport(StackFields, BaseModel):
    project: str
    workspace: str
    checked_at: datetime
    revision: int | None
    """The release whose state was compared (latest)."""
    drifted: bool
    summary: DriftSummary
    report_ref: str | None = None
    """Masked per-field diffs of every drifted resource (a blob), when there were any."""
    workflow_id: str | None = None
    run_id: str | None = None
    repair_workflow_id: str | None = None
    """The apply a ``--repair`` check started."""


def schedule_id(stack: StackRef) -> str:
    """The id of ``stack``'s drift-check Schedule (``stackflow drift schedule``)."""
    return f"stackflow-drift/{stack}"


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
MIN_EVERY = timedelta(seconds=10)
"""The shortest interval between scheduled drift checks."""


def parse_every(text: str, option: str = "--every") -> timedelta:
    """``30s``, ``5m``, ``1h``, ``1h30m``: at least :data:`MIN_EVERY` (SpecError naming
    ``option`` otherwise): ``stackflow drift schedule --every`` and the API's ``every``."""
    m = _DURATION.match(text.strip())
    if not text.strip() or m is None:
        raise SpecError(f"{option} {text}: write a duration such as 30s, 5m, 1h or 1h30m")
    hours, minutes, seconds = (int(g or 0) for g in m.groups())
    every = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if every < MIN_EVERY:
        raise SpecError(f"{option} {text}: at least 10s between checks")
    return every
