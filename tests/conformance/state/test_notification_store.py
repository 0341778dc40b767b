"""State conformance, NotificationStore: a project's destinations replaced as a whole, or added,
replaced and removed one by one, and read in order, secrets sealed when keys are configured;
failed deliveries kept once per (destination, event), newest first. Every backend (SQLite and
PostgreSQL) passes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from stackflow.core.errors import ConflictError
from stackflow.model.notifications import TARGET_LIMIT, NotificationFailure, NotificationTarget
from stackflow.state.protocols import NotificationStore
from tests.conformance.state.common import narrow

SECRET = "a-notification-secret-0123"


@pytest.fixture
def store(backend: Any) -> Any:
    return narrow(backend, NotificationStore)


def target(name: str, **over: Any) -> NotificationTarget:
    data = {"name": name, "url": f"https://hooks.example.com/{name}", "secret": SECRET}
    return NotificationTarget.model_validate({**data, **over})


def failure(event: str, at: datetime, target: str = "a", **over: Any) -> NotificationFailure:
    data = {
        "project": "p",
        "target": target,
        "type": "io.stackflow.run.failed",
        "event_id": event,
        "run_id": "r1",
        "attempts": 4,
        "error": "a: answered HTTP 500",
        "failed_at": at,
    }
    return NotificationFailure.model_validate({**data, **over})


def test_targets_are_replaced_as_a_whole(store: Any) -> None:
    assert store.notification_targets("p") == []
    store.set_notification_targets(
        "p", [target("b"), target("a", types=["io.stackflow.run.failed"])]
    )
    assert [t.name for t in store.notification_targets("p")] == ["b", "a"]
    assert store.notification_targets("p")[1].types == ["io.stackflow.run.failed"]
    assert store.notification_targets("p")[0].secret == SECRET
    assert store.notification_targets("q") == []
    store.set_notification_targets("p", [target("c")])
    assert [t.name for t in store.notification_targets("p")] == ["c"]
    store.set_notification_targets("p", [])
    assert store.notification_targets("p") == []


def test_targets_one_by_one(store: Any) -> None:
    """Added after the others, replaced in place, removed; the limit holds; the whole-list
    replace and the one-by-one calls see the same list."""
    assert store.put_notification_target("p", target("a")) is True
    assert store.put_notification_target("p", target("b")) is True
    assert store.put_notification_target("p", target("a", url="https://x.example.com/a2")) is False
    assert [(t.name, t.url) for t in store.notification_targets("p")] == [
        ("a", "https://x.example.com/a2"),
        ("b", "https://hooks.example.com/b"),
    ]
    assert store.notification_targets("p")[0].secret == SECRET
    assert store.remove_notification_target("p", "a") is True
    assert store.remove_notification_target("p", "a") is False
    assert store.remove_notification_target("q", "b") is False
    assert store.put_notification_target("p", target("c")) is True
    assert [t.name for t in store.notification_targets("p")] == ["b", "c"]
    store.set_notification_targets("p", [target("z"), target("y")])
    store.put_notification_target("p", target("x"))
    assert [t.name for t in store.notification_targets("p")] == ["z", "y", "x"]
    for i in range(TARGET_LIMIT - 3):
        store.put_notification_target("p", target(f"n{i}"))
    with pytest.raises(ConflictError, match="remove one first"):
        store.put_notification_target("p", target("one-more"))
    assert store.put_notification_target("p", target("z")) is False  # a replace still is
    assert len(store.notification_targets("p")) == TARGET_LIMIT


def test_failures_are_kept_once_newest_first(store: Any) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.record_notification_failure(failure("e1", t0))
    store.record_notification_failure(failure("e2", t0 + timedelta(seconds=5)))
    store.record_notification_failure(failure("e1", t0 + timedelta(seconds=9), attempts=1))
    store.record_notification_failure(failure("e1", t0, target="b"))
    store.record_notification_failure(failure("e9", t0, project="q"))
    found = store.notification_failures("p")
    assert [(f.target, f.event_id, f.attempts) for f in found] == [
        ("a", "e1", 1),
        ("a", "e2", 4),
        ("b", "e1", 4),
    ]
    assert found[0].failed_at == t0 + timedelta(seconds=9)
    assert len(store.notification_failures("p", limit=1)) == 1


def test_target_secrets_are_sealed_at_rest(tmp_path: Path) -> None:
    from stackflow.core.crypto import KeyRing, new_key_line
    from stackflow.state.backend import open_backend

    backend = open_backend(
        f"sqlite:///{tmp_path / 'state.db'}", keys=KeyRing.parse(new_key_line("k1"), "test")
    )
    try:
        backend.set_notification_targets("p", [target("a")])
        with backend.engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT secret FROM notification_targets")).scalar_one()
        assert SECRET not in stored
        assert backend.notification_targets("p")[0].secret == SECRET
    finally:
        backend.close()
