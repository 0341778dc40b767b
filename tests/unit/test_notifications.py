"""Notifications: which run events are announced as which CloudEvent type, the CloudEvent's
fields, the signature, destinations refusing what they cannot be."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from stackflow.activities.notify import notice_of
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import EventType, NewEvent, approval_wait, run_complete
from stackflow.model.notifications import TYPES, NotificationTarget, body_of, cloud_type, signature


def test_which_events_are_announced() -> None:
    assert cloud_type(EventType.run_start, {}) == "io.stackflow.run.started"
    wait = approval_wait("approval", 60)
    assert cloud_type(wait.type, wait.data) == "io.stackflow.run.awaiting_approval"
    paused = approval_wait("decision", 60)
    assert cloud_type(paused.type, paused.data) == "io.stackflow.run.paused"
    ok, bad = run_complete("succeeded"), run_complete("failed", error="x")
    assert cloud_type(ok.type, ok.data) == "io.stackflow.run.succeeded"
    assert cloud_type(bad.type, bad.data) == "io.stackflow.run.failed"
    for quiet in (EventType.phase, EventType.apply_complete, EventType.planned_change):
        assert cloud_type(quiet, {}) is None


def test_a_notice_is_a_cloudevent_of_the_run() -> None:
    stack, run = StackRef("p", "w"), RunRef("stackflow/p/w", "run-1")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    event = run_complete("failed", revision=3, error="a: boom").model_copy(update={"at": at})
    notice = notice_of(stack, run, event)
    assert notice is not None and notice.type == "io.stackflow.run.failed"
    ce = notice.event
    assert ce["specversion"] == "1.0" and ce["id"] == notice.event_id and len(ce["id"]) == 32
    assert ce["source"] == "/stackflow/p/w" and ce["subject"] == "run-1"
    assert ce["time"] == at.isoformat() and ce["datacontenttype"] == "application/json"
    assert ce["data"]["error"] == "a: boom" and ce["data"]["revision"] == 3
    assert ce["data"]["workflow_id"] == "stackflow/p/w"
    assert notice_of(stack, run, NewEvent(type=EventType.phase, key="k")) is None
    # run_start and run_complete have the same key in every run: the id is still the run's
    other = notice_of(stack, RunRef("stackflow/p/w", "run-2"), event)
    again = notice_of(stack, run, event)
    assert other is not None and again is not None
    assert other.event_id != notice.event_id == again.event_id


def test_signature_and_body() -> None:
    body = body_of({"b": 1, "a": [1, 2]})
    assert body == b'{"a":[1,2],"b":1}'
    expected = hmac.new(b"s" * 16, body, hashlib.sha256).hexdigest()
    assert signature("s" * 16, body) == f"sha256={expected}"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "ftp://example.com/x"),
        ("url", "https://example.com/a b"),
        ("name", "a/b"),
        ("secret", "short"),
        ("types", ["io.stackflow.run.exploded"]),
    ],
)
def test_a_destination_refuses(field: str, value: object) -> None:
    data = {"name": "a", "url": "https://example.com/hook", "secret": "s" * 16, field: value}
    with pytest.raises(ValidationError) as err:
        NotificationTarget.model_validate(data)
    assert err.value.errors()[0]["loc"][0] == field


def test_a_destination_takes_every_type_by_default_and_shows_no_secret() -> None:
    target = NotificationTarget(name="a", url="https://example.com/hook", secret="s" * 16)
    assert target.types == list(TYPES) and "secret" not in target.public()
