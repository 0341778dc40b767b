"""``POST /v1/sets/{name}/runs`` refuses, before Temporal is asked anything: no token (401), a
member whose project the caller may not operate (403 naming it), ``auto_approve`` without the
approver role on every member, and a bad set (a cycle, a reference to no resource: 422)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stackflow.api.app import create_app
from stackflow.api.auth import parse_tokens
from stackflow.state.backend import StateBackend
from tests.unit.asgi_api import no_temporal, problem, store

__all__ = ["store"]

ROLES = {"ops": {"net*": "approver", "db*": "operator", "svc*": "viewer"}}


@pytest.fixture
async def api(store: StateBackend) -> AsyncIterator[httpx.AsyncClient]:
    table = parse_tokens(
        json.dumps(
            [
                {"name": n, "sha256": hashlib.sha256(n.encode()).hexdigest(), "roles": r}
                for n, r in ROLES.items()
            ]
        )
    )
    app = create_app(no_temporal("a refused set run never reaches Temporal"), store, table)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as client:
        yield client


def _file(path: str, content: str) -> dict[str, Any]:
    return {
        "id": f"onprem:File:{path}",
        "type": "OnPrem",
        "attributes": {"kind": "File", "path": path, "content": content},
    }


def _member(project: str, content: str = "x", **extra: Any) -> dict[str, Any]:
    spec = {"resources": [_file(f"/tmp/{project}", content)]}
    return {"project": project, "workspace": "prod", "spec": spec, **extra}


OPS = {"Authorization": "Bearer ops"}


async def test_no_token_is_401(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/sets/s/runs", json={"operation": "apply", "members": [_member("net")]})
    problem(r, 401)


async def test_every_member_needs_its_role(api: httpx.AsyncClient) -> None:
    body = {"operation": "apply", "members": [_member("net"), _member("svc")]}
    detail = problem(await api.post("/v1/sets/s/runs", json=body, headers=OPS), 403)
    assert detail == (
        "ops is viewer on project svc; a set apply needs operator on every stack's project"
    )
    body = {"operation": "apply", "members": [_member("net"), _member("db")], "auto_approve": True}
    detail = problem(await api.post("/v1/sets/s/runs", json=body, headers=OPS), 403)
    assert (
        detail
        == "ops is operator on project db; auto_approve needs approver on every stack's project"
    )


async def test_a_bad_set_is_422_in_one_line(api: httpx.AsyncClient) -> None:
    reads_db = "$stack.db/prod.onprem:File:/tmp/db.content"
    reads_net = "$stack.net/prod.onprem:File:/tmp/net.content"
    body = {"operation": "preview", "members": [_member("net", reads_db), _member("db", reads_net)]}
    detail = problem(await api.post("/v1/sets/s/runs", json=body, headers=OPS), 422)
    assert detail.startswith("set s: a cycle between stacks: "), detail
    missing = "$stack.net/prod.onprem:File:/tmp/nope.content"
    body = {"operation": "preview", "members": [_member("net"), _member("db", missing)]}
    detail = problem(await api.post("/v1/sets/s/runs", json=body, headers=OPS), 422)
    assert detail == f"set s: db/prod: {missing}: stack net/prod has no such resource"
