"""The typed client's git source and notification destination calls against a stubbed
transport: each sends the method, path and body the API takes (the source as ``on_push``,
the secret only in the request), reads the answer as the API's models, a 204 as nothing,
and a problem as the typed error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stackflow.client import (
    ApiInvalid,
    ApiNotFound,
    ApiProtocolError,
    NotificationTargetView,
    SourceView,
    StackflowClient,
)
from stackflow.client.types import parse
from stackflow.core.refs import StackRef
from stackflow.model.notifications import Destination
from stackflow.model.source import GitSource, SourceMode
from tests.unit.client_fakes import FakeTransport, Reply, Sent

STACK = StackRef("demo", "dev")
SECRET = "a-webhook-secret-of-some-length"
URL = "https://git.example.com/acme/infra.git"
VIEW = {"url": URL, "ref": "main", "path": "deploy/spec.yaml", "on_push": "preview"}


class Stub:
    """Answers each request with the next of ``answers``; keeps what was sent."""

    def __init__(self, *answers: Reply) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str, Any]] = []

    def __call__(self, request: Sent) -> Reply:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.method, request.path, body))
        return self.answers.pop(0)

    def client(self) -> StackflowClient:
        return StackflowClient("http://api.test", "tok", transport=FakeTransport(self))


def problem(status: int, kind: str, detail: str) -> Reply:
    body = {"type": f"urn:stackflow:problem:{kind}", "status": status, "detail": detail}
    return Reply(status, json=body, headers={"Content-Type": "application/problem+json"})


def test_set_show_unset_a_source() -> None:
    answer = {**VIEW, "auto_approve": True}
    stub = Stub(Reply(200, json=answer), Reply(200, json=answer), Reply(204))
    source = GitSource(
        url=URL,
        path="deploy/spec.yaml",
        on_push=SourceMode.preview,
        auto_approve=True,
        secret=SECRET,
    )
    with stub.client() as api:
        view = api.set_source(STACK, source)
        assert view == parse(SourceView, answer) and view.on_push == SourceMode.preview
        assert api.source(STACK) == view
        assert api.unset_source(STACK) is None
    (put, get, delete) = stub.sent
    assert put == (
        "PUT",
        "/v1/stacks/demo/dev/source",
        {
            "url": URL,
            "ref": "main",
            "path": "deploy/spec.yaml",
            "on_push": "preview",
            "auto_approve": True,
            "secret": SECRET,
        },
    )
    assert get == ("GET", "/v1/stacks/demo/dev/source", None)
    assert delete == ("DELETE", "/v1/stacks/demo/dev/source", None)


def test_source_problems_are_typed() -> None:
    stub = Stub(
        problem(404, "not-found", "stack demo/dev has no git source"),
        problem(422, "invalid-input", "url: a git source is an http(s) URL"),
        Reply(200, json={"url": URL}),
    )
    source = GitSource(url=URL, path="s.yaml", secret=SECRET)
    with stub.client() as api:
        with pytest.raises(ApiNotFound, match="no git source") as missing:
            api.unset_source(STACK)
        assert missing.value.exit_code == 1
        with pytest.raises(ApiInvalid) as invalid:
            api.set_source(STACK, source)
        assert invalid.value.exit_code == 2
        with pytest.raises(ApiProtocolError, match="SourceView"):
            api.source(STACK)


def test_add_list_show_remove_a_destination() -> None:
    ops = {"name": "ops", "url": "https://hooks.example.com/ops", "types": ["x.failed"]}
    stub = Stub(
        Reply(200, json=ops),
        Reply(200, json=[ops, {**ops, "name": "b"}]),
        Reply(200, json=ops),
        Reply(204),
        problem(404, "not-found", "project demo has no notification destination ops"),
    )
    destination = Destination(
        url="https://hooks.example.com/ops", secret=SECRET, types=["io.stackflow.run.failed"]
    )
    with stub.client() as api:
        assert api.set_notification("demo", "ops", destination) == NotificationTargetView(**ops)
        assert [v.name for v in api.notifications("demo")] == ["ops", "b"]
        assert api.notification("demo", "ops").url == ops["url"]
        assert api.remove_notification("demo", "ops") is None
        with pytest.raises(ApiNotFound):
            api.remove_notification("demo", "ops")
    assert stub.sent[0] == (
        "PUT",
        "/v1/projects/demo/notifications/ops",
        {
            "url": "https://hooks.example.com/ops",
            "secret": SECRET,
            "types": ["io.stackflow.run.failed"],
        },
    )
    assert [(m, p) for m, p, _ in stub.sent[1:]] == [
        ("GET", "/v1/projects/demo/notifications"),
        ("GET", "/v1/projects/demo/notifications/ops"),
        ("DELETE", "/v1/projects/demo/notifications/ops"),
        ("DELETE", "/v1/projects/demo/notifications/ops"),
    ]


def test_a_destination_list_that_is_not_a_list_is_a_protocol_error() -> None:
    stub = Stub(Reply(200, json={"targets": []}))
    with stub.client() as api, pytest.raises(ApiProtocolError, match="not a list"):
        api.notifications("demo")
