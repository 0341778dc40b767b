"""The event stream of a run: what happened, in order, for pipelines and terminals.

Types follow OpenTofu's machine-readable UI (``tofu apply -json``): ``run_start``, ``phase``,
``planned_change``, ``change_summary``, ``approval_wait``, ``apply_start``, ``apply_complete``,
``apply_errored``, ``run_complete``. Every event is ``{seq, type, time, ...}``; ``seq`` counts
from 1 per run with no gap, so ``after=SEQ`` (or SSE's ``Last-Event-ID``) resumes exactly.

Where they live: in the state backend (``run_events``), not in Temporal history. Activities
append them as they happen (a resource's ``apply_complete`` within a fraction of a second of
its apply), each with a dedupe key made of the activity's run, its activity id and the
subject, so an activity retried by Temporal appends nothing twice; history keeps its byte
budget whatever a run's size, and any API replica serves any stream from the database. A run
that ended without its own ``run_complete`` (terminated, timed out, failed before it could
write one) gets one from whoever reads it first, under the same dedupe key.

Nothing sensitive is in an event: ids, types, actions, counts and the same one-line errors a
release records.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

STREAM_VERSION = 1
"""The stream format's version, in its first line."""
STREAM_NAME = "stackflow.events"
ERROR_LIMIT = 1000
"""Characters of an error an event carries."""
PAGE_LIMIT = 500
"""Events one read returns at most."""


class EventType(StrEnum):
    run_start = "run_start"
    phase = "phase"
    planned_change = "planned_change"
    change_summary = "change_summary"
    approval_wait = "approval_wait"
    policy_decision = "policy_decision"
    apply_start = "apply_start"
    apply_complete = "apply_complete"
    apply_errored = "apply_errored"
    run_complete = "run_complete"
    stack_complete = "stack_complete"
    """A set run's stream only: one member run's ``run_complete`` (its ``stack`` named)."""


class NewEvent(BaseModel):
    """An event to append: its type, what it says, and the dedupe key (one event per key and
    run: appending it again does nothing)."""

    model_config = ConfigDict(frozen=True)

    type: EventType
    key: str = Field(min_length=1)
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime | None = None
    """When it happened (a resource's apply returned); the append's time if not given."""

    @property
    def digest(self) -> str:
        """The key as stored (fixed length, whatever the resource id)."""
        return hashlib.sha256(self.key.encode("utf-8", "surrogatepass")).hexdigest()


class RunEvent(BaseModel):
    """An event as stored and served."""

    model_config = ConfigDict(frozen=True)

    seq: int
    type: EventType
    time: datetime
    data: dict[str, Any] = Field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """The event as one stream line: ``{seq, type, time, ...data}``."""
        return {
            "seq": self.seq,
            "type": self.type.value,
            "time": self.time.isoformat(),
            **self.data,
        }

    def line(self) -> str:
        return json.dumps(self.wire(), separators=(",", ":"), ensure_ascii=False)


class StreamHeader(BaseModel):
    """The first line of a stream."""

    stream: str = STREAM_NAME
    version: int = STREAM_VERSION
    project: str
    workspace: str
    workflow_id: str
    run_id: str

    def line(self) -> str:
        return json.dumps(self.model_dump(), separators=(",", ":"))


def resource_ref(resource_id: str, resource_type: str | None) -> dict[str, Any]:
    return {"id": resource_id, "type": resource_type}


def short(error: str | None) -> str | None:
    if error is None:
        return None
    return error if len(error) <= ERROR_LIMIT else error[: ERROR_LIMIT - 1] + "…"


def run_complete(
    status: str,
    *,
    revision: int | None = None,
    error: str | None = None,
    counts: dict[str, int] | None = None,
    source: str = "run",
) -> NewEvent:
    """The last event of every run (one per run: the key is fixed). ``source`` says who
    wrote it: the run itself, or a reader that found the run closed without one."""
    data: dict[str, Any] = {"status": status, "revision": revision, "error": short(error)}
    if counts is not None:
        data["counts"] = counts
    if source != "run":
        data["source"] = source
    return NewEvent(type=EventType.run_complete, key="run_complete", data=data)


def change_summary(operation: str, summary: dict[str, int]) -> NewEvent:
    """What a preview found, counted (OpenTofu's add / change / remove)."""
    return NewEvent(
        type=EventType.change_summary,
        key="change_summary",
        data={
            "operation": operation,
            "add": summary.get("Create", 0),
            "change": summary.get("Update", 0),
            "remove": summary.get("Delete", 0),
            "unchanged": summary.get("UnChanged", 0),
        },
    )


def policy_decision(decision: dict[str, Any]) -> NewEvent:
    """What the policy gate decided (outcome, counts, the first messages, digests): warnings
    show here as in the preview."""
    return NewEvent(type=EventType.policy_decision, key="policy_decision", data=decision)


def approval_wait(wait: str, timeout_seconds: float, *, four_eyes: bool = False) -> NewEvent:
    """The run waits for a person: ``approval`` (approve or reject) or ``decision`` (retry or
    abort the failed nodes)."""
    data: dict[str, Any] = {"wait": wait, "timeout_seconds": timeout_seconds}
    if four_eyes:
        data["four_eyes"] = True
    return NewEvent(type=EventType.approval_wait, key="approval_wait", data=data)


__all__ = [
    "ERROR_LIMIT",
    "PAGE_LIMIT",
    "STREAM_NAME",
    "STREAM_VERSION",
    "EventType",
    "NewEvent",
    "RunEvent",
    "StreamHeader",
    "approval_wait",
    "change_summary",
    "policy_decision",
    "resource_ref",
    "run_complete",
    "short",
]
