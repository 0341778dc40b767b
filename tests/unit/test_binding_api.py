"""Binding a git source and notification destinations through the real app on a real SQLite
backend (no Temporal needed): a source's ``on_push`` (``mode``, its former name, accepted
too; answers and the OpenAPI document say ``on_push``), one destination at a time by name
(``PUT|GET|DELETE /v1/projects/{project}/notifications/{name}``) beside the whole list, the
roles they need, and bad input answered with one line naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import ValidationError

from stackflow.client.types import SourceView, parse
from stackflow.core.refs import StackRef
from stackflow.model.notifications import TARGET_LIMIT, TYPES, Destination, NotificationTarget
from stackflow.model.source import GitSource, SourceMode
from stackflow.state.backend import StateBackend
from tests.unit import asgi_api
from tests.unit.asgi_api import asgi_client, auth, problem

SECRET = "a-webhook-secret-of-some-length"
URL = "https://git.example.com/acme/infra.git"
FAILED = "io.stackflow.run.failed"

store = asgi_api.store  # the state backend the app serves (a fixture)


@pytest.fixture
async def api(store: StateBackend) -> AsyncIterator[httpx.AsyncClient]:
    async for client in asgi_client(store, "binding never reaches Temporal"):
        yield client


def test_on_push_is_the_field_and_mode_its_former_name() -> None:
    base = {"url": URL, "path": "spec.yaml", "secret": SECRET}
    assert GitSource.model_validate(base).on_push == SourceMode.apply
    assert GitSource.model_validate({**base, "on_push": "preview"}).on_push == SourceMode.preview
    old = GitSource.model_validate({**base, "mode": "preview"})
    assert old.on_push == SourceMode.preview
    assert old.public() == {
        "url": URL,
        "ref": "main",
        "path": "spec.yaml",
        "on_push": "preview",
        "auto_approve": False,
    }
    with pytest.raises(ValidationError, match="on_push and mode"):
        GitSource.model_validate({**base, "on_push": "apply", "mode": "preview"})
    with pytest.raises(ValidationError) as err:
        GitSource.model_validate({**base, "on_push": "destroy"})
    assert err.value.errors()[0]["loc"] == ("on_push",)
    assert parse(SourceView, old.public()).on_push == SourceMode.preview


def test_a_destination_is_a_target_without_its_name() -> None:
    d = Destination(url="https://hooks.example.com/x", secret=SECRET)
    assert d.types == list(TYPES) and SECRET not in repr(d)
    assert d.named("ops") == NotificationTarget(
        name="ops", url="https://hooks.example.com/x", secret=SECRET
    )
    for bad in ({"url": "ftp://x/y"}, {"types": ["io.stackflow.run.nope"]}, {"secret": "short"}):
        with pytest.raises(ValidationError):
            Destination.model_validate({"url": "https://h/x", "secret": SECRET, **bad})


async def test_a_source_takes_on_push_or_mode_and_answers_on_push(
    api: httpx.AsyncClient, store: StateBackend
) -> None:
    path = "/v1/stacks/acme/dev/source"
    body = {"url": URL, "ref": "main", "path": "deploy/spec.yaml", "secret": SECRET}
    r = await api.put(path, json={**body, "on_push": "preview"}, headers=auth())
    assert r.status_code == 200, r.text
    assert r.json() == {
        "url": URL,
        "ref": "main",
        "path": "deploy/spec.yaml",
        "on_push": "preview",
        "auto_approve": False,
    }
    r = await api.put(path, json={**body, "mode": "preview", "auto_approve": True}, headers=auth())
    assert r.status_code == 200 and r.json()["on_push"] == "preview" and "mode" not in r.json()
    shown = await api.get(path, headers=auth("viewer"))
    assert shown.json()["on_push"] == "preview" and shown.json()["auto_approve"] is True
    assert SECRET not in shown.text and SECRET not in r.text
    bound = store.source_of(StackRef("acme", "dev"))
    assert bound is not None and bound.on_push == SourceMode.preview and bound.secret == SECRET

    both = {**body, "on_push": "apply", "mode": "preview"}
    assert "on_push and mode" in problem(await api.put(path, json=both, headers=auth()), 422)
    bad = {**body, "on_push": "destroy"}
    assert problem(await api.put(path, json=bad, headers=auth()), 422).startswith("on_push:")
    problem(await api.put(path, json=body, headers=auth("operator")), 403)


async def test_the_openapi_document_says_on_push(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert "on_push" in schemas["GitSource"]["properties"]
    assert "mode" not in schemas["GitSource"]["properties"]
    assert "former name" in schemas["GitSource"]["properties"]["on_push"]["description"]
    assert set(schemas["SourceView"]["properties"]) == {
        "url",
        "ref",
        "path",
        "on_push",
        "auto_approve",
    }
    one = doc["paths"]["/v1/projects/{project}/notifications/{name}"]
    assert set(one) == {"put", "get", "delete"}
    answer = one["put"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["$ref"].endswith("/NotificationTargetView")
    assert set(schemas["Destination"]["properties"]) == {"url", "secret", "types"}
    source = doc["paths"]["/v1/stacks/{project}/{workspace}/source"]["get"]
    assert source["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SourceView"
    )


async def test_destinations_one_by_one(api: httpx.AsyncClient) -> None:
    base = "/v1/projects/acme/notifications"
    ops = {"url": "https://hooks.example.com/ops", "secret": SECRET}
    r = await api.put(f"{base}/ops", json=ops, headers=auth())
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "ops", "url": ops["url"], "types": list(TYPES)}
    failed_only = {**ops, "url": "https://hooks.example.com/b", "types": [FAILED]}
    assert (await api.put(f"{base}/b", json=failed_only, headers=auth())).status_code == 200
    # replacing keeps its place; the list and one read back without secrets
    moved = {**ops, "url": "https://hooks.example.com/ops2"}
    assert (await api.put(f"{base}/ops", json=moved, headers=auth())).status_code == 200
    listed = await api.get(base, headers=auth("viewer"))
    assert [(t["name"], t["url"]) for t in listed.json()] == [
        ("ops", moved["url"]),
        ("b", failed_only["url"]),
    ]
    one = await api.get(f"{base}/b", headers=auth("viewer"))
    assert one.json() == {"name": "b", "url": failed_only["url"], "types": [FAILED]}
    assert SECRET not in listed.text + one.text
    # the dead-letter list is still what …/failed is
    assert (await api.get(f"{base}/failed", headers=auth("viewer"))).json() == []

    # roles: as the whole list (approver writes, viewer reads)
    problem(await api.put(f"{base}/c", json=ops, headers=auth("operator")), 403)
    problem(await api.delete(f"{base}/ops", headers=auth("operator")), 403)

    assert (await api.delete(f"{base}/ops", headers=auth())).status_code == 204
    assert [t["name"] for t in (await api.get(base, headers=auth())).json()] == ["b"]
    assert "no notification destination ops" in problem(
        await api.delete(f"{base}/ops", headers=auth()), 404
    )
    problem(await api.get(f"{base}/ops", headers=auth()), 404)


async def test_bad_destinations_are_one_line_problems(api: httpx.AsyncClient) -> None:
    base = "/v1/projects/acme/notifications"
    ok = {"url": "https://hooks.example.com/x", "secret": SECRET}
    bad_type = {**ok, "types": ["io.stackflow.run.nope"]}
    assert "unknown type" in problem(await api.put(f"{base}/x", json=bad_type, headers=auth()), 422)
    bad_url = {**ok, "url": "file:///etc/passwd"}
    assert problem(await api.put(f"{base}/x", json=bad_url, headers=auth()), 422).startswith("url:")
    short = {**ok, "secret": "short"}
    detail = problem(await api.put(f"{base}/x", json=short, headers=auth()), 422)
    assert detail.startswith("secret:") and "short" not in detail.removeprefix("secret:")
    named = {**ok, "name": "x"}
    assert "unknown field" in problem(await api.put(f"{base}/x", json=named, headers=auth()), 422)
    assert "reserved" in problem(await api.put(f"{base}/failed", json=ok, headers=auth()), 422)
    problem(await api.put(f"{base}/a%20b", json=ok, headers=auth()), 422)
    for i in range(TARGET_LIMIT):
        assert (await api.put(f"{base}/t{i}", json=ok, headers=auth())).status_code == 200
    assert "remove one first" in problem(
        await api.put(f"{base}/one-more", json=ok, headers=auth()), 409
    )
    assert (await api.put(f"{base}/t0", json=ok, headers=auth())).status_code == 200  # replace
