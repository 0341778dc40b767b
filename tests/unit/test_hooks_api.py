"""The webhook endpoints' answers to bad deliveries, through the real app on a real SQLite
backend (no Temporal needed: nothing gets that far): problem+json naming what is wrong, a
401 for a delivery no bound stack's secret verifies, ignored pushes (other branch, files not
touched, a deleted branch) a 202 saying why, per stack; bindings read back without secret."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from stackflow.api.app import create_app
from stackflow.api.auth import parse_tokens
from stackflow.core.refs import StackRef
from stackflow.model.source import GitSource
from stackflow.state.backend import open_backend

SECRET = "a-webhook-secret-of-some-length"
URL = "https://git.example.com/acme/infra.git"
COMMIT = "ab" * 20
ADMIN = "admin-token-for-these-tests"


async def no_temporal() -> Client:
    raise AssertionError("these deliveries never reach Temporal")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    for workspace, ref in (("dev", "main"), ("prod", "release")):
        source = GitSource(url=URL, ref=ref, path="deploy/spec.yaml", secret=SECRET)
        backend.bind_source(StackRef("acme", workspace), source)
    digest = hashlib.sha256(ADMIN.encode()).hexdigest()
    table = parse_tokens(
        json.dumps([{"name": "admin", "sha256": digest, "roles": {"*": "approver"}}])
    )
    app = create_app(no_temporal, backend, table)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    backend.close()


def signed(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def github(
    api: httpx.AsyncClient, data: Any, *, secret: str = SECRET, event: str = "push"
) -> httpx.Response:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    headers = {"X-GitHub-Event": event, "X-Hub-Signature-256": signed(body, secret)}
    return await api.post("/v1/hooks/github", content=body, headers=headers)


def push(**over: Any) -> dict[str, Any]:
    return {
        "ref": "refs/heads/feature",
        "after": COMMIT,
        "repository": {"clone_url": URL},
        "commits": [{"modified": ["deploy/spec.yaml"]}],
        **over,
    }


def problem(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert "Traceback" not in r.text
    detail: str = r.json()["detail"]
    return detail


async def test_bad_deliveries_are_problems(api: httpx.AsyncClient) -> None:
    assert "not JSON" in problem(await github(api, b"{not json"), 400)
    assert "JSON object" in problem(await github(api, [1, 2]), 422)
    assert "repository" in problem(await github(api, {"ref": "x"}), 422)
    assert "after: not a commit" in problem(await github(api, push(after="HEAD")), 422)
    # no stack's secret verifies it: 401, whatever else is wrong
    assert "nothing started" in problem(await github(api, push(), secret="x" * 20), 401)
    other = push(repository={"clone_url": "https://git.example.com/acme/other.git"})
    assert "none is bound" in problem(await github(api, other), 401)
    no_signature = await api.post(
        "/v1/hooks/github", content=json.dumps(push()).encode(), headers={"X-GitHub-Event": "push"}
    )
    problem(no_signature, 401)


async def test_ignored_pushes_say_why_per_stack(api: httpx.AsyncClient) -> None:
    r = await github(api, push())
    assert r.status_code == 202, r.text
    reasons = {(i["workspace"], i["reason"]) for i in r.json()["ignored"]}
    assert reasons == {
        ("dev", "a push to refs/heads/feature, not refs/heads/main"),
        ("prod", "a push to refs/heads/feature, not refs/heads/release"),
    }
    r = await github(api, push(ref="refs/heads/main", commits=[{"modified": ["README.md"]}]))
    assert r.status_code == 202
    assert ("dev", "the pushed commits do not change deploy/spec.yaml") in {
        (i["workspace"], i["reason"]) for i in r.json()["ignored"]
    }
    r = await github(api, push(ref="refs/heads/main", after="0" * 40, deleted=True))
    assert r.status_code == 202 and "was deleted" in r.text
    r = await github(api, push(), event="issues")
    assert r.status_code == 202 and "starts nothing" in r.text
    assert (await github(api, push(), event="ping")).status_code == 200


async def test_cloudevents_are_checked(api: httpx.AsyncClient) -> None:
    async def send(event: Any, secret: str = SECRET) -> httpx.Response:
        body = json.dumps(event).encode()
        headers = {"X-Stackflow-Signature": signed(body, secret)}
        return await api.post("/v1/hooks/generic", content=body, headers=headers)

    data = {"repository": URL, "ref": "refs/heads/feature", "commit": COMMIT}
    event = {"specversion": "1.0", "id": "e1", "source": "/ci", "type": "push", "data": data}
    assert "specversion" in problem(await send({**event, "specversion": "0.3"}), 422)
    assert "id: required" in problem(await send({**event, "id": ""}), 422)
    assert "data:" in problem(await send({**event, "data": "x"}), 422)
    assert "data.repository" in problem(await send({**event, "data": {"commit": COMMIT}}), 422)
    problem(await send(event, secret="y" * 20), 401)
    r = await send(event)
    assert r.status_code == 202 and r.json()["delivery"] == "e1"


async def test_a_binding_reads_back_without_its_secret(api: httpx.AsyncClient) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    r = await api.get("/v1/stacks/acme/dev/source", headers=headers)
    assert r.status_code == 200 and SECRET not in r.text and r.json()["ref"] == "main"
    bad = {"url": "file://elsewhere/etc", "path": "spec.yaml", "secret": SECRET}
    assert "url" in problem(
        await api.put("/v1/stacks/acme/dev/source", json=bad, headers=headers), 422
    )
    assert (await api.delete("/v1/stacks/acme/dev/source", headers=headers)).status_code == 204
    problem(await api.get("/v1/stacks/acme/dev/source", headers=headers), 404)
