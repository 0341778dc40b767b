"""The API's token file, roles and guard, without Temporal: tokens are parsed (YAML or JSON),
checked by hash, roles ordered viewer < operator < approver per project glob; the guard
answers 401 before reading a body, 413 over the limit, and problem+json for everything."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from stackflow.api.app import create_app
from stackflow.api.auth import TokenTable, bearer, load_tokens, parse_tokens, token_hash
from stackflow.api.identity import Role
from stackflow.core.errors import SpecError
from stackflow.state.backend import open_backend


def entry(name: str, token: str, roles: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "sha256": hashlib.sha256(token.encode()).hexdigest(), "roles": roles}


def test_yaml_and_json_files_read_alike() -> None:
    entries = [entry("ci", "t1", {"team-*": "operator", "team-a": "approver"})]
    as_json = parse_tokens(json.dumps(entries))
    as_yaml = parse_tokens(
        "tokens:\n"
        f"  - name: ci\n    sha256: {token_hash('t1')}\n"
        "    roles: {team-*: operator, team-a: approver}\n"
    )
    for table in (as_json, as_yaml):
        who = table.authenticate("t1")
        assert who is not None and who.name == "ci"
        assert who.role_for("team-a") == Role.approver  # the highest matching glob
        assert who.role_for("team-b") == Role.operator
        assert who.role_for("other") is None


def test_roles_include_the_ones_below() -> None:
    table = parse_tokens(json.dumps([entry("a", "x", {"*": "approver"})]))
    who = table.authenticate("x")
    assert who is not None
    assert all(who.allows("p", role) for role in Role)
    viewer = parse_tokens(json.dumps([entry("v", "y", {"p*": "viewer"})])).authenticate("y")
    assert viewer is not None
    assert viewer.allows("p1", Role.viewer) and not viewer.allows("p1", Role.operator)
    assert not viewer.allows("q", Role.viewer)


def test_globs_are_case_sensitive() -> None:
    who = parse_tokens(json.dumps([entry("a", "x", {"Team-*": "viewer"})])).authenticate("x")
    assert who is not None and who.role_for("team-a") is None


def test_unknown_and_empty_tokens_are_refused() -> None:
    table = parse_tokens(json.dumps([entry("a", "x", {"*": "viewer"})]))
    assert table.authenticate("y") is None
    assert table.authenticate("") is None
    assert table.authenticate("x\udcff") is None  # not UTF-8: no crash
    assert TokenTable([]).authenticate("x") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "invalid YAML"),
        ("name: a", "a list of tokens"),
        ('[{"name": "a", "sha256": "abc"}]', "token 1: sha256: String should match"),
        (json.dumps([entry("a", "x", {"*": "admin"})]), "role 'admin' of '*'"),
        (json.dumps([{**entry("a", "x", {}), "token": "x"}]), "token 1: token: unknown field"),
        (json.dumps([entry("a", "x", {}), entry("a", "y", {})]), "the name 'a' is given twice"),
        (json.dumps([entry("", "x", {})]), "token 1: name:"),
    ],
)
def test_bad_files_name_the_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=None) as err:
        parse_tokens(text, "tokens.json")
    assert message in str(err.value) and str(err.value).startswith("tokens.json")


def test_load_tokens_needs_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STACKFLOW_API_TOKENS", raising=False)
    with pytest.raises(SpecError, match="STACKFLOW_API_TOKENS is not set"):
        load_tokens()
    with pytest.raises(SpecError, match="cannot read"):
        load_tokens(str(tmp_path / "missing.json"))
    path = tmp_path / "t.yaml"
    path.write_text(json.dumps([entry("a", "x", {"*": "viewer"})]))
    monkeypatch.setenv("STACKFLOW_API_TOKENS", str(path))
    assert load_tokens().authenticate("x") is not None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic abc", None),
        ("Bearer abc", "abc"),
        ("bearer abc ", "abc"),
        ("Bearer " + "x" * 5000, None),
    ],
)
def test_bearer_header(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


async def no_temporal() -> Client:
    raise RuntimeError("Failed client connect: tcp connect error: connection refused")


@pytest.fixture
async def http(tmp_path: Path) -> Any:
    table = parse_tokens(
        json.dumps([entry("admin", "adm", {"*": "approver"}), entry("v", "view", {"*": "viewer"})])
    )
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    app = create_app(no_temporal, backend, table, max_body_bytes=4096)
    transport = httpx.ASGITransport(app=app)  # raises any exception the app lets out
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    backend.close()


def problem_of(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["type"].startswith("urn:stackflow:problem:")
    detail: str = body["detail"]
    return detail


async def test_guard_answers_401_before_the_body(http: httpx.AsyncClient) -> None:
    url = "/v1/stacks/p/w/runs"
    assert "required" in problem_of(await http.post(url, content=b"{not json"), 401)
    r = await http.post(url, content=b"x" * 10_000, headers={"Authorization": "Bearer nope"})
    assert "not valid" in problem_of(r, 401)
    assert r.headers["www-authenticate"] == "Bearer"


async def test_body_limit_is_413(http: httpx.AsyncClient) -> None:
    headers = {"Authorization": "Bearer adm", "Content-Type": "application/json"}
    r = await http.post("/v1/stacks/p/w/runs", content=b"[" + b" " * 5000 + b"]", headers=headers)
    assert "over 4096 bytes" in problem_of(r, 413)

    async def chunks() -> Any:  # no Content-Length: counted while read
        for _ in range(10):
            yield b" " * 1000

    r = await http.post("/v1/stacks/p/w/runs", content=chunks(), headers=headers)
    assert "over 4096 bytes" in problem_of(r, 413)


async def test_roles_and_unreachable_temporal(http: httpx.AsyncClient) -> None:
    viewer = {"Authorization": "Bearer view"}
    admin = {"Authorization": "Bearer adm"}
    r = await http.post("/v1/stacks/p/w/runs", json={"operation": "destroy"}, headers=viewer)
    assert problem_of(r, 403) == "v is viewer on project p; this needs operator"
    # Temporal down: the CLI's one line, 503, no traceback
    r = await http.post("/v1/stacks/p/w/runs", json={"operation": "destroy"}, headers=admin)
    assert problem_of(r, 503).startswith("cannot reach Temporal at")
    r = await http.get("/v1/readyz")
    assert "temporal: unreachable" in problem_of(r, 503)
    # the state backend answers without Temporal
    assert (await http.get("/v1/stacks/p/w/releases", headers=viewer)).json() == []
    assert "has no releases" in problem_of(
        await http.get("/v1/stacks/p/w/outputs", headers=viewer), 404
    )


async def test_metrics_count_requests_by_route_never_by_name(http: httpx.AsyncClient) -> None:
    viewer = {"Authorization": "Bearer view"}
    await http.get("/v1/stacks/secret-project/w/releases", headers=viewer)
    await http.get("/v1/stacks/secret-project/w/releases", headers=viewer)
    await http.get("/v1/stacks/secret-project/w/releases")  # 401, before routing
    r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    route = "/v1/stacks/{project}/{workspace}/releases"
    assert f'stackflow_api_requests_total{{method="GET",route="{route}",status="200"}} 2' in text
    assert 'stackflow_api_requests_total{method="GET",route="(no route)",status="401"} 1' in text
    assert f'stackflow_api_request_seconds_count{{method="GET",route="{route}"}} 2' in text
    assert f'stackflow_api_request_seconds_bucket{{method="GET",route="{route}",le="+Inf"}} 2' in (
        text
    )
    assert "secret-project" not in text


def series(text: str) -> set[str]:
    """The metric series of an exposition (each sample line without its value)."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


async def test_made_up_methods_paths_and_statuses_never_grow_metrics(
    http: httpx.AsyncClient,
) -> None:
    """An unauthenticated caller sending 1,000 made-up methods (on routes, on unknown paths,
    under /v1/stacks/) leaves /metrics with the same series: one ``other`` bucket."""
    viewer = {"Authorization": "Bearer view"}
    paths = ["/metrics", "/v1/healthz", "/nowhere/{n}", "/v1/stacks/p{n}/w/releases"]
    for n, path in enumerate(paths):  # each kind of series, once
        await http.request(f"MADEUP{n}", path.format(n=n))
        await http.request(f"MADEUP{n}", path.format(n=n), headers=viewer)
    await http.get("/v1/stacks/p/w/releases", headers=viewer)
    await http.get("/metrics")
    before = (await http.get("/metrics")).text
    for n in range(1000):
        path = paths[n % len(paths)].format(n=n)
        await http.request(f"X{n}-{uuid.uuid4().hex[:8]}", path, headers=viewer if n % 2 else {})
    after = (await http.get("/metrics")).text
    assert series(after) == series(before)
    assert len(after) - len(before) < 300  # only counts grew (a few digits each)
    assert 'method="other",route="/metrics",status="405"' in after
    assert 'method="other",route="(no route)",status="404"' in after
    assert "MADEUP" not in after and "/nowhere" not in after and "p1" not in after


def test_status_and_method_labels_are_bounded() -> None:
    from stackflow.api.metrics import Metrics

    m = Metrics()
    m.request("BREW", "/x", 999, 0.1)
    m.request("GET", "/x", 200, 0.1)
    text = m.render()
    assert 'method="other",route="/x",status="other"' in text
    assert 'method="GET",route="/x",status="200"' in text and "BREW" not in text
