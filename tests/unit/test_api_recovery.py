"""The API's unlock, release import/export and drift report through the real app on a real
SQLite backend (no Temporal: a lock held by no run is freed without asking it): an unlock
is an approver's, an import checks everything before it writes and never goes over
releases, an export is what ``stackflow release export`` writes, a drift report is what
``stackflow drift status --output json`` prints; and the OpenAPI document names them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from stackflow.core.refs import StackRef
from stackflow.model.drift import DriftReport, DriftSummary
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import Resource, ResourceType
from stackflow.state.backend import StateBackend
from stackflow.state.kusion import export_kusion_releases, write_kusion_stack
from tests.unit import asgi_api
from tests.unit.asgi_api import asgi_client, auth, problem

STACK = StackRef("p", "w")

store = asgi_api.store  # the state backend the app serves (a fixture)


@pytest.fixture
async def api(store: StateBackend) -> AsyncIterator[httpx.AsyncClient]:
    async for client in asgi_client(
        store, "a lock held by no run is freed without asking Temporal"
    ):
        yield client


def two_releases(store: StateBackend, stack: StackRef = STACK) -> None:
    first = store.create(stack, Operation.apply, None)
    store.record_resource(stack, first.revision, Resource(id="a", type=ResourceType.OnPrem))
    store.set_phase(stack, first.revision, Phase.succeeded)
    store.create(stack, Operation.destroy, None)  # no run: held by nobody Temporal knows


async def test_unlock_is_an_approvers(api: httpx.AsyncClient, store: StateBackend) -> None:
    url = "/v1/stacks/p/w/unlock"
    assert "has no releases" in problem(await api.post(url, headers=auth()), 404)
    two_releases(store)
    for who in ("viewer", "operator"):
        detail = problem(await api.post(url, headers=auth(who)), 403)
        assert f"{who} is {who} on project p; this needs approver" == detail
    assert store.lock(STACK) is not None
    r = await api.post(url, json={"force": False}, headers=auth())
    assert r.status_code == 200, r.text
    assert r.json() == {
        "project": "p",
        "workspace": "w",
        "unlocked": True,
        "revision": 2,
        "phase": "failed",
        "reason": "unlocked by hand by admin; the operation may not have finished",
    }
    assert store.lock(STACK) is None and store.phase_of(STACK, 2) is Phase.failed
    again = await api.post(url, headers=auth())
    assert again.json()["unlocked"] is False and again.json()["phase"] == "failed"
    bad = await api.post(url, json={"forced": True}, headers=auth())
    assert problem(bad, 422) == "forced: unknown field"


async def test_export_is_the_clis_and_import_goes_only_into_empty_stacks(
    api: httpx.AsyncClient, store: StateBackend, tmp_path: Path
) -> None:
    two_releases(store)
    store.unlock(STACK)
    two_releases(store, StackRef("p", "x"))
    store.unlock(StackRef("p", "x"))
    two_releases(store, StackRef("q", "w"))
    r = await api.get("/v1/projects/p/releases/export", headers=auth("viewer"))
    assert r.status_code == 200, r.text
    stacks = r.json()["stacks"]
    assert [(s["project"], s["workspace"]) for s in stacks] == [("p", "w"), ("p", "x")]
    one = await api.get("/v1/projects/p/releases/export?workspace=x", headers=auth("viewer"))
    assert [s["workspace"] for s in one.json()["stacks"]] == ["x"]

    # written as the CLI writes them, the files are those the direct export writes
    for s in stacks:
        write_kusion_stack(tmp_path / "api", StackRef(s["project"], s["workspace"]), s["releases"])
    export_kusion_releases(store, tmp_path / "direct", "p")
    found = sorted(p.relative_to(tmp_path / "api") for p in (tmp_path / "api").rglob("*.y*ml"))
    assert len(found) == 6
    for rel in found:
        assert (tmp_path / "api" / rel).read_text() == (tmp_path / "direct" / rel).read_text()

    # into project r: each release's project is the path's
    releases: list[dict[str, Any]] = []
    for s in stacks:
        for doc in s["releases"]:
            releases.append({**doc, "project": "r"})
    url = "/v1/projects/r/releases/import"
    assert "needs approver" in problem(
        await api.post(url, json={"releases": releases}, headers=auth("operator")), 403
    )
    wrong = [{**releases[0], "project": "q"}]
    assert "release of project q" in problem(
        await api.post(url, json={"releases": wrong}, headers=auth()), 422
    )
    twice = [releases[0], releases[0]]
    assert "revision 1 is given more than once" in problem(
        await api.post(url, json={"releases": twice}, headers=auth()), 422
    )
    assert store.revisions(StackRef("r", "w")) == []
    r = await api.post(url, json={"releases": releases}, headers=auth())
    assert r.status_code == 201, r.text
    assert r.json() == {"project": "r", "imported": {"r/w": 2, "r/x": 2}}
    assert [(x.revision, x.phase) for x in store.list(StackRef("r", "x"))] == [
        (1, Phase.succeeded),
        (2, Phase.failed),
    ]
    # over releases: refused, nothing written (r/y would be new, r/w is not)
    more = [{**releases[0], "workspace": "y"}, releases[0]]
    assert "stack r/w already has stackflow releases" in problem(
        await api.post(url, json={"releases": more}, headers=auth()), 409
    )
    assert store.revisions(StackRef("r", "y")) == []


async def test_drift_status_is_the_last_report(api: httpx.AsyncClient, store: StateBackend) -> None:
    url = "/v1/stacks/p/w/drift"
    assert "p/w has no drift report yet" in problem(await api.get(url, headers=auth()), 404)
    rows = [{"id": "a", "action": "Update", "diff": [{"path": "x", "old": 1, "new": 2}]}]
    ref = store.put_blob("drift_report", json.dumps(rows).encode())
    report = DriftReport(
        project="p",
        workspace="w",
        checked_at=datetime(2026, 11, 29, tzinfo=UTC),
        revision=1,
        drifted=True,
        summary=DriftSummary(checked=1, drifted=1, ids=["a"]),
        report_ref=ref,
        workflow_id="stackflow/p/w/drift",
        run_id="r1",
    )
    store.put_drift_report(report)
    r = await api.get(url, headers=auth("viewer"))
    assert r.status_code == 200, r.text
    assert r.json() == {**report.model_dump(mode="json"), "drifted_resources": rows}


async def test_the_openapi_document_names_the_new_calls(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/openapi.json")).json()
    paths = {p: sorted(methods) for p, methods in doc["paths"].items()}
    assert paths["/v1/stacks/{project}/{workspace}/drift/schedule"] == ["delete", "put"]
    assert paths["/v1/stacks/{project}/{workspace}/drift"] == ["get"]
    assert paths["/v1/stacks/{project}/{workspace}/unlock"] == ["post"]
    assert paths["/v1/projects/{project}/releases/import"] == ["post"]
    assert paths["/v1/projects/{project}/releases/export"] == ["get"]
    ids = [op["operationId"] for methods in doc["paths"].values() for op in methods.values()]
    assert len(ids) == len(set(ids))
