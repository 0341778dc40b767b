"""Outbound notifications: every run announces its transitions to the project's webhook
destinations as CloudEvents 1.0 (structured JSON), signed with each destination's secret.

Which transitions: the run's own events (:mod:`stackflow.model.events`) map to CloudEvent types
(:func:`cloud_type`): ``run_start`` → ``io.stackflow.run.started``, ``approval_wait`` →
``…awaiting_approval`` (or ``…paused`` when it waits for retry/abort), a ``policy_decision``
that denies → ``…policy_denied``, ``run_complete`` → ``…succeeded`` / ``…failed``. The
activity that appends such an event starts one ``NotifyWorkflow`` for it (workflow id from
the event's dedupe key: a retried activity starts none twice); that workflow delivers to
each destination with bounded retries and records a delivery that never succeeded in the
state backend (``stackflow notifications failed``). The run never waits for a delivery: a
slow or dead receiver changes nothing about it.

Nothing sensitive is in a notification: the same ids, counts and one-line errors as events.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stackflow.model.events import EventType

SIGNATURE_HEADER = "X-Stackflow-Signature"
TYPES = (
    "io.stackflow.run.started",
    "io.stackflow.run.awaiting_approval",
    "io.stackflow.run.policy_denied",
    "io.stackflow.run.paused",
    "io.stackflow.run.succeeded",
    "io.stackflow.run.failed",
    "io.stackflow.run.drift_detected",
)
TARGET_LIMIT = 20
"""Destinations one project may have."""
TARGET_NAME = r"^[A-Za-z0-9._-]+$"
RESERVED_NAMES = frozenset({"failed"})
"""Names a destination added one by one cannot have: ``GET …/notifications/failed`` is the
dead-letter list."""


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")) or not url.isprintable() or " " in url:
        raise ValueError("an http(s) URL")
    return url


def _check_types(types: list[str]) -> list[str]:
    unknown = sorted(set(types) - set(TYPES))
    if unknown:
        raise ValueError(f"unknown type {unknown[0]!r}: one of {', '.join(TYPES)}")
    return types


class NotificationTarget(BaseModel):
    """A webhook destination of a project."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=TARGET_NAME)
    url: str = Field(max_length=2000)
    secret: str = Field(min_length=16, max_length=256, repr=False)
    """What the ``X-Stackflow-Signature`` HMAC-SHA256 is made with (stored sealed)."""
    types: list[str] = Field(default_factory=lambda: list(TYPES), max_length=len(TYPES))
    """The CloudEvent types it receives (default: all)."""

    _url = field_validator("url")(classmethod(lambda cls, v: _check_url(v)))
    _types = field_validator("types")(classmethod(lambda cls, v: _check_types(v)))

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"secret"})


class Destination(BaseModel):
    """``PUT /v1/projects/{project}/notifications/{name}``: one destination, named by the
    path (:meth:`named` is the :class:`NotificationTarget` it sets)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2000)
    secret: str = Field(min_length=16, max_length=256, repr=False)
    """What the ``X-Stackflow-Signature`` HMAC-SHA256 is made with (stored sealed)."""
    types: list[str] = Field(default_factory=lambda: list(TYPES), max_length=len(TYPES))
    """The CloudEvent types it receives (default: all)."""

    _url = field_validator("url")(classmethod(lambda cls, v: _check_url(v)))
    _types = field_validator("types")(classmethod(lambda cls, v: _check_types(v)))

    def named(self, name: str) -> NotificationTarget:
        return NotificationTarget(name=name, url=self.url, secret=self.secret, types=self.types)


class NotificationFailure(BaseModel):
    """A delivery that did not succeed within its retries (the dead-letter list)."""

    project: str
    target: str
    type: str
    event_id: str
    run_id: str | None
    attempts: int
    error: str
    failed_at: datetime


class Notice(BaseModel):
    """One notification to deliver: NotifyWorkflow's input (small: no spec, no state)."""

    project: str
    workspace: str
    type: str
    event_id: str
    event: dict[str, Any]
    """The CloudEvent (JSON), signed per destination when it is sent."""


def cloud_type(event_type: EventType, data: dict[str, Any]) -> str | None:
    """The CloudEvent type a run event announces (None: not announced)."""
    if event_type == EventType.run_start:
        return "io.stackflow.run.started"
    if event_type == EventType.approval_wait:
        wait = data.get("wait")
        return (
            "io.stackflow.run.paused"
            if wait == "decision"
            else ("io.stackflow.run.awaiting_approval")
        )
    if event_type == EventType.policy_decision:
        return "io.stackflow.run.policy_denied" if data.get("outcome") == "deny" else None
    if event_type == EventType.run_complete:
        ok = data.get("status") == "succeeded"
        return "io.stackflow.run.succeeded" if ok else "io.stackflow.run.failed"
    return None


def cloud_event(
    *,
    kind: str,
    event_id: str,
    project: str,
    workspace: str,
    workflow_id: str,
    run_id: str,
    time: datetime,
    data: dict[str, Any],
) -> dict[str, Any]:
    """A CloudEvents 1.0 structured JSON event of a run."""
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": f"/stackflow/{project}/{workspace}",
        "type": kind,
        "subject": run_id,
        "time": time.isoformat(),
        "datacontenttype": "application/json",
        "data": {
            "project": project,
            "workspace": workspace,
            "workflow_id": workflow_id,
            "run_id": run_id,
            **data,
        },
    }


def body_of(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, body: bytes) -> str:
    """The ``X-Stackflow-Signature`` value: ``sha256=<hex HMAC-SHA256 of the body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
