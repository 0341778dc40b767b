"""`stackflow serve` through real HTTP: a server process and a worker of this checkout on the
dev Temporal and PostgreSQL (a task queue and database of their own), driven with httpx as
another service would. Start → status → approve → succeeded, preview, idempotent start,
a busy stack, tokens and roles, and bad requests answered with problem+json, never a 500."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from stackflow.state.backend import open_backend
from stackflow.state.schema import run_keys
from tests.integration.conftest import REPO, WorkerProcess, require_env, require_port
from tests.integration.opshelp import dir_resource, file_resource, new_project

pytestmark = pytest.mark.integration

TOKENS = {
    "admin": ("admin-token", {"*": "approver"}),
    "viewer": ("viewer-token", {"*": "viewer"}),
    "operator": ("operator-token", {"*": "operator"}),
    "elsewhere": ("elsewhere-token", {"other-*": "approver"}),
    # on the four-eyes projects alone (the worker's STACKFLOW_FOUR_EYES): test_approval_roles
    "fe-operator": ("fe-operator-token", {"foureyes-*": "operator"}),
    "fe-approver": ("fe-approver-token", {"foureyes-*": "approver"}),
    "fe-second": ("fe-second-token", {"foureyes-*": "approver"}),
    "fe-viewer": ("fe-viewer-token", {"foureyes-*": "viewer"}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def api_env(
    tmp_path_factory: pytest.TempPathFactory, integration_postgres_url: str
) -> dict[str, str]:
    address = require_env("TEMPORAL_ADDRESS")
    require_port("Temporal dev server", address)
    home = tmp_path_factory.mktemp("api-home")
    tokens = home / "tokens.json"
    tokens.write_text(
        json.dumps(
            [
                {"name": name, "sha256": hashlib.sha256(tok.encode()).hexdigest(), "roles": roles}
                for name, (tok, roles) in TOKENS.items()
            ]
        )
    )
    env = dict(os.environ)
    env.update(
        STACKFLOW_HOME=str(home),
        STACKFLOW_STATE_URL=integration_postgres_url,
        STACKFLOW_TASK_QUEUE=f"test-api-{uuid.uuid4().hex[:8]}",
        STACKFLOW_API_TOKENS=str(tokens),
        STACKFLOW_FOUR_EYES="foureyes-*",
        PYTHONPATH=str(REPO),
    )
    env.setdefault("STACKFLOW_ONPREM_ROOTS", tempfile.gettempdir())
    return env


@pytest.fixture(scope="module")
def api_worker(
    api_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(
        tmp_path_factory.mktemp("api-worker"), api_env["STACKFLOW_TASK_QUEUE"], api_env
    )
    worker.start()
    yield worker
    worker.stop()


class ApiServer:
    """One `stackflow serve` process of this checkout, as `make up` starts it."""

    def __init__(self, env: dict[str, str], log: Path, port: int | None = None) -> None:
        self.env, self.log = env, log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ApiServer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stackflow.cli.main", "serve", "--port", str(self.port)],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"stackflow serve exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/v1/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.proc.terminate()
                pytest.fail(f"stackflow serve not ready in 60s:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown of its own."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def api_url(
    api_env: dict[str, str], api_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`stackflow serve` on a free port, as `make up` starts it."""
    server = ApiServer(api_env, tmp_path_factory.mktemp("api-log") / "api.log").start()
    yield server.url
    server.stop()
    assert "Traceback" not in server.log.read_text(), server.tail()


@pytest.fixture
def http(api_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_url, timeout=60) as client:
        yield client


def auth(name: str = "admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name][0]}"}


def small_spec(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "app"
    return {
        "resources": [
            dir_resource(root),
            file_resource(root / "app.conf", "port = 8080\n", deps=[f"onprem:Directory:{root}"]),
        ]
    }


def wait_run(
    http: httpx.Client, url: str, done: Callable[[dict[str, Any]], bool], timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = http.get(url, headers=auth("viewer"))
        assert r.status_code == 200, r.text
        view: dict[str, Any] = r.json()
        if done(view):
            return view
        assert time.monotonic() < deadline, f"run did not get there: {view}"
        time.sleep(0.3)


def is_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body: dict[str, Any] = r.json()
    assert set(body) >= {"type", "title", "status", "detail"} and body["status"] == status
    assert "Traceback" not in r.text and 'File "' not in r.text
    return body


def test_apply_start_status_approve_succeeds(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    base = f"/v1/stacks/{project}/dev"
    r = http.post(
        f"{base}/runs",
        json={"operation": "apply", "spec": small_spec(tmp_path), "message": "first deploy"},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["operation"] == "apply"
    assert created["workflow_id"] == f"stackflow/{project}/dev"
    assert created["status_url"] == f"{base}/runs/{created['run_id']}"
    assert created["events_url"] == created["status_url"] + "/events"
    assert r.headers["location"] == created["status_url"]

    view = wait_run(http, created["status_url"], lambda v: v["phase"] == "awaitingApproval")
    assert view["status"] == "running" and view["requested_by"] == "operator"
    assert view["message"] == "first deploy" and view["summary"]["Create"] == 2

    preview = http.get(f"{created['status_url']}/preview", headers=auth("viewer"))
    assert preview.status_code == 200, preview.text
    assert {c["action"] for c in preview.json()["changes"]} == {"Create"}

    # an operator may not approve; an approver may, and is recorded
    is_problem(http.post(f"{created['status_url']}/approve", headers=auth("operator")), 403)
    r = http.post(
        f"{created['status_url']}/approve", json={"comment": "lgtm"}, headers=auth("admin")
    )
    assert r.status_code == 200, r.text
    assert r.json()["result"] == "approved by admin"
    # a second decision is refused: the run no longer waits for one
    is_problem(http.post(f"{created['status_url']}/reject", headers=auth("admin")), 409)

    view = wait_run(http, created["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded", view
    assert view["revision"] == 1 and view["approved_by"] == "admin"
    assert view["requested_by"] == "operator" and view["ended_at"] is not None
    assert (tmp_path / "app" / "app.conf").read_text() == "port = 8080\n"

    listed = http.get(f"{base}/releases", headers=auth("viewer")).json()
    assert [(x["revision"], x["phase"], x["operation"]) for x in listed] == [
        (1, "succeeded", "apply")
    ]
    assert listed[0]["approval"]["by"] == "admin" and listed[0]["approval"]["reason"] == "lgtm"
    release = http.get(f"{base}/releases/1", headers=auth("viewer")).json()
    assert len(release["state"]["resources"]) == 2
    outputs = http.get(f"{base}/outputs", headers=auth("viewer")).json()
    conf = outputs["outputs"][f"onprem:File:{tmp_path / 'app' / 'app.conf'}"]
    assert outputs["revision"] == 1 and conf["content"] == "port = 8080\n"
    # a step on a run that has ended is refused, naming why
    body = is_problem(http.post(f"{created['status_url']}/cancel", headers=auth("admin")), 409)
    assert "has ended" in body["detail"]


def test_preview_run(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    spec_yaml = json.dumps(small_spec(tmp_path))  # JSON is YAML: read as `-f` reads a file
    r = http.post(
        f"/v1/stacks/{project}/default/runs",
        json={"operation": "preview", "spec_yaml": spec_yaml},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    assert r.json()["workflow_id"].endswith("/preview")
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["status"] == "completed" and view["operation"] == "preview", view
    changes = http.get(f"{url}/preview", headers=auth("viewer")).json()
    assert changes["summary"]["Create"] == 2
    assert not (tmp_path / "app").exists()  # a preview changes nothing


def test_idempotent_start_is_one_run(
    http: httpx.Client, tmp_path: Path, api_env: dict[str, str]
) -> None:
    project = new_project()
    body = {"operation": "apply", "spec": small_spec(tmp_path)}
    key = {"Idempotency-Key": f"deploy-{uuid.uuid4().hex}"}
    url = f"/v1/stacks/{project}/default/runs"
    first = http.post(url, json=body, headers=auth() | key)
    assert first.status_code == 201, first.text
    second = http.post(url, json=body, headers=auth() | key)
    assert second.status_code == 200, second.text
    assert second.json()["run_id"] == first.json()["run_id"]
    other = http.post(url, json={**body, "max_concurrency": 2}, headers=auth() | key)
    assert "another request" in is_problem(other, 422)["detail"]

    # cancel (idempotent too, as an Update id); a finished keyed run is still found
    run = first.json()["status_url"]
    wait_run(http, run, lambda v: v["phase"] == "awaitingApproval")
    r = http.post(f"{run}/cancel", headers=auth("operator"))
    assert r.status_code == 200, r.text
    view = wait_run(http, run, lambda v: v["status"] != "running")
    assert view["phase"] == "failed", view
    again = http.post(url, json=body, headers=auth() | key)
    assert again.status_code == 200 and again.json()["run_id"] == first.json()["run_id"]

    # the key's claim holds the run; a claim whose run was never recorded (the API stopped
    # between the start and the record) finds it through the run's memo, and records it
    state = open_backend(api_env["STACKFLOW_STATE_URL"])
    mine = (run_keys.c.project == project, run_keys.c.key == key["Idempotency-Key"])
    try:
        with state.engine.begin() as conn:
            [row] = conn.execute(sa.select(run_keys).where(*mine)).all()
            assert row.run_id == first.json()["run_id"]
            conn.execute(run_keys.update().where(*mine).values(workflow_id=None, run_id=None))
        lost = http.post(url, json=body, headers=auth() | key)
        assert lost.status_code == 200 and lost.json()["run_id"] == first.json()["run_id"]
        with state.engine.begin() as conn:
            assert (
                conn.execute(sa.select(run_keys.c.run_id).where(*mine)).scalar()
                == (first.json()["run_id"])
            )
    finally:
        state.close()
    metrics = http.get("/metrics").text
    assert 'stackflow_api_runs_started_total{operation="apply",kind="idempotent"}' in metrics


def test_busy_stack_is_409_naming_the_run(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    url = f"/v1/stacks/{project}/default/runs"
    first = http.post(
        url, json={"operation": "apply", "spec": small_spec(tmp_path)}, headers=auth()
    )
    assert first.status_code == 201, first.text
    run_id = first.json()["run_id"]
    key = {"Idempotency-Key": f"busy-{uuid.uuid4().hex}"}
    busy = http.post(url, json={"operation": "destroy"}, headers=auth() | key)
    detail = is_problem(busy, 409)["detail"]
    assert run_id in detail and f"stack {project}/default" in detail
    wait_run(http, first.json()["status_url"], lambda v: v["phase"] == "awaitingApproval")
    r = http.post(
        f"{first.json()['status_url']}/reject", json={"comment": "no"}, headers=auth("admin")
    )
    assert r.status_code == 200 and r.json()["result"] == "rejected by admin", r.text
    view = wait_run(http, first.json()["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "failed" and view["approved_by"] is None
    # the refused start gave its key up: the key starts another request now
    later = http.post(
        url, json={"operation": "destroy", "max_concurrency": 2}, headers=auth() | key
    )
    assert later.status_code == 201, later.text


def test_paused_run_is_aborted(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must go\n")
    spec = {"resources": [file_resource(blocker / "x", "x\n")]}
    r = http.post(
        f"/v1/stacks/{project}/default/runs",
        json={"operation": "apply", "spec": spec, "auto_approve": True, "on_failure": "pause"},
        headers=auth("admin"),  # auto_approve needs the approver role
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    view = wait_run(http, url, lambda v: v["phase"] == "awaitingDecision")
    assert view["failed"] == 1
    is_problem(http.post(f"{url}/approve", headers=auth("admin")), 409)  # not awaiting approval
    r = http.post(f"{url}/abort", json={"comment": "give up"}, headers=auth("operator"))
    assert r.status_code == 200 and "abort requested by operator" in r.text, r.text
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["phase"] == "failed"


def test_tokens_and_roles(http: httpx.Client) -> None:
    project = new_project()
    releases = f"/v1/stacks/{project}/default/releases"
    is_problem(http.get(releases), 401)
    r = http.get(releases, headers={"Authorization": "Bearer not-a-token"})
    assert is_problem(r, 401) and r.headers["www-authenticate"] == "Bearer"
    is_problem(http.get(releases, headers={"Authorization": "Basic YTpi"}), 401)
    assert http.get(releases, headers=auth("viewer")).json() == []
    runs = f"/v1/stacks/{project}/default/runs"
    detail = is_problem(http.post(runs, json={"operation": "destroy"}, headers=auth("viewer")), 403)
    assert "viewer" in detail["detail"] and "operator" in detail["detail"]
    is_problem(http.get(releases, headers=auth("elsewhere")), 403)
    assert (
        http.get("/v1/stacks/other-team/default/releases", headers=auth("elsewhere")).status_code
        == 200
    )
    # health and the OpenAPI document need no token
    assert http.get("/v1/healthz").json()["status"] == "ok"
    assert http.get("/v1/readyz").json()["checks"] == {"temporal": "ok", "state_backend": "ok"}
    assert "/v1/stacks/{project}/{workspace}/runs" in http.get("/openapi.json").json()["paths"]


def test_bad_requests_are_problems_never_500(http: httpx.Client) -> None:
    project = new_project()
    runs = f"/v1/stacks/{project}/default/runs"
    json_headers = auth() | {"Content-Type": "application/json"}
    unknown_run = f"{runs}/{uuid.uuid4()}"
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", runs, {"content": b"{not json", "headers": json_headers}, 400),
        ("POST", runs, {"content": b"", "headers": json_headers}, 422),
        ("POST", runs, {"json": [1, 2], "headers": auth()}, 422),
        ("POST", runs, {"json": {}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": "explode"}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": 7}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": "apply"}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": "apply", "spec": "x"}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": "apply", "spec": {}}, "headers": auth()}, 422),
        (
            "POST",
            runs,
            {
                "json": {"operation": "apply", "spec": {"resources": [{"id": "a"}]}},
                "headers": auth(),
            },
            422,
        ),
        (
            "POST",
            runs,
            {"json": {"operation": "apply", "spec_yaml": "resources: [\n"}, "headers": auth()},
            422,
        ),
        (
            "POST",
            runs,
            {"json": {"operation": "apply", "spec_yaml": "a: 1\na: 2\n"}, "headers": auth()},
            422,
        ),
        ("POST", runs, {"json": {"operation": "destroy", "spec": {}}, "headers": auth()}, 422),
        ("POST", runs, {"json": {"operation": "rollback"}, "headers": auth()}, 422),
        (
            "POST",
            runs,
            {"json": {"operation": "rollback", "to_revision": 0}, "headers": auth()},
            422,
        ),
        (
            "POST",
            runs,
            {"json": {"operation": "destroy", "max_concurrency": "many"}, "headers": auth()},
            422,
        ),
        ("POST", runs, {"json": {"operation": "destroy", "bogus": 1}, "headers": auth()}, 422),
        (
            "POST",
            runs,
            {"json": {"operation": "destroy", "on_failure": "explode"}, "headers": auth()},
            422,
        ),
        (
            "POST",
            runs,
            {"content": b"{" + b" " * (9 * 1024 * 1024) + b"}", "headers": json_headers},
            413,
        ),
        (
            "POST",
            "/v1/stacks/bad$name/default/runs",
            {"json": {"operation": "destroy"}, "headers": auth()},
            422,
        ),
        ("GET", unknown_run, {"headers": auth()}, 404),
        ("GET", f"{runs}/not-a-run-id", {"headers": auth()}, 404),
        ("POST", f"{unknown_run}/approve", {"headers": auth()}, 404),
        ("POST", f"{unknown_run}/approve", {"json": {"comment": 5}, "headers": auth()}, 422),
        ("GET", f"/v1/stacks/{project}/default/releases/abc", {"headers": auth()}, 422),
        ("GET", f"/v1/stacks/{project}/default/releases/7", {"headers": auth()}, 404),
        ("GET", f"/v1/stacks/{project}/default/outputs", {"headers": auth()}, 404),
        ("DELETE", runs, {"headers": auth()}, 405),
        ("GET", "/v1/nothing-here", {}, 404),
    ]
    for method, url, kwargs, status in cases:
        r = http.request(method, url, **kwargs)
        body = is_problem(r, status)
        assert body["detail"] and "\n" not in body["detail"], (method, url, body)
    assert len(cases) >= 15
    # the detail is the CLI's one line: resource and field for a spec error
    r = http.post(
        runs, json={"operation": "apply", "spec": {"resources": [{"id": "a"}]}}, headers=auth()
    )
    assert is_problem(r, 422)["detail"] == "spec: resources[0] (id 'a'): type: Field required"
    r = http.post(runs, json={"operation": "apply", "spec_yaml": "a: 1\na: 2\n"}, headers=auth())
    assert 'duplicate key "a"' in is_problem(r, 422)["detail"]


def test_runs_listing_and_release_diff(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    base = f"/v1/stacks/{project}/default"
    spec = small_spec(tmp_path)
    urls = []
    for content in ("port = 1\n", "port = 2\n"):
        spec["resources"][1]["attributes"]["content"] = content
        r = http.post(
            f"{base}/runs",
            json={"operation": "apply", "spec": spec, "auto_approve": True},
            headers=auth("admin"),  # auto_approve needs the approver role
        )
        assert r.status_code == 201, r.text
        urls.append(r.json()["status_url"])
        view = wait_run(http, urls[-1], lambda v: v["status"] != "running")
        assert view["phase"] == "succeeded", view
        # auto_approve: the approval names the caller, as the CLI's --yes names the user
        assert view["approved_by"] == "admin (auto_approve)"

    page = http.get(f"{base}/runs", params={"page_size": 1}, headers=auth("viewer")).json()
    assert len(page["runs"]) == 1 and page["next_page_token"]
    rest = http.get(
        f"{base}/runs", params={"page_token": page["next_page_token"]}, headers=auth("viewer")
    ).json()
    listed = page["runs"] + rest["runs"]
    assert {f"{base}/runs/{x['run_id']}" for x in listed} == set(urls)
    assert {(x["operation"], x["status"], x["requested_by"]) for x in listed} == {
        ("apply", "completed", "admin")
    }
    for token in ("%%%", "bm90IGEgdG9rZW4"):  # not base64; base64 of no token
        bad = http.get(f"{base}/runs", params={"page_token": token}, headers=auth("viewer"))
        assert "page_token" in is_problem(bad, 422)["detail"]

    diff = http.get(f"{base}/releases/1/diff/2", headers=auth("viewer"))
    assert diff.status_code == 200, diff.text
    [changed] = diff.json()["spec"]["resources"]
    assert changed["change"] == "changed"
    assert [(f["path"], f["old"], f["new"]) for f in changed["fields"]] == [
        ("content", "port = 1\n", "port = 2\n")
    ]
    is_problem(http.get(f"{base}/releases/1/diff/9", headers=auth("viewer")), 404)


@pytest.mark.parametrize("content", ["random", "repeated"])
async def test_a_big_spec_goes_by_reference(
    http: httpx.Client, tmp_path: Path, content: str
) -> None:
    """Over the history budget, the spec is stored in the state backend first and the run's
    input names it (``spec_ref``), as the CLI does with the backend: a spec that would
    compress far under the budget too (the workflow and its first activity would each
    decode it whole)."""
    import base64

    from temporalio.client import Client

    from stackflow.temporal.codec import data_converter
    from tests.integration.opshelp import payload_json_async

    if content == "random":
        texts = [base64.b64encode(os.urandom(120_000)).decode() for _ in range(3)]
    else:  # 400 KB of JSON, a few KB compressed
        texts = [f"line {i}\n" * 120 for i in range(400)]
    resources = [file_resource(tmp_path / f"big{i}", text) for i, text in enumerate(texts)]
    project = new_project()
    r = http.post(
        f"/v1/stacks/{project}/default/runs",
        json={"operation": "preview", "spec": {"resources": resources}},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    view = wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
    assert view["status"] == "completed", view
    client = await Client.connect(
        require_env("TEMPORAL_ADDRESS"),
        namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    handle = client.get_workflow_handle(r.json()["workflow_id"], run_id=r.json()["run_id"])
    async for event in handle.fetch_history_events():
        [payload] = event.workflow_execution_started_event_attributes.input.payloads
        started = await payload_json_async(payload)
        break
    assert started["spec_ref"].startswith("sha256:") and started.get("spec") is None
    changes = http.get(f"{r.json()['status_url']}/preview", headers=auth("viewer")).json()
    assert changes["summary"]["Create"] == len(texts)


def test_every_operation_through_the_api(http: httpx.Client, tmp_path: Path) -> None:
    project = new_project()
    base = f"/v1/stacks/{project}/default"
    conf = tmp_path / "app" / "app.conf"

    def run(body: dict[str, Any]) -> dict[str, Any]:
        # auto_approve needs the approver role; a drift check is an operator's
        who = "admin" if body.get("auto_approve") else "operator"
        r = http.post(f"{base}/runs", json=body, headers=auth(who))
        assert r.status_code == 201, r.text
        return wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")

    spec = small_spec(tmp_path)
    assert run({"operation": "apply", "spec": spec, "auto_approve": True})["revision"] == 1
    spec["resources"][1]["attributes"]["content"] = "port = 9\n"
    assert run({"operation": "apply", "spec": spec, "auto_approve": True})["revision"] == 2
    assert conf.read_text() == "port = 9\n"

    view = run({"operation": "refresh", "auto_approve": True})
    assert (view["operation"], view["phase"], view["revision"]) == ("refresh", "succeeded", 3)
    view = run({"operation": "rollback", "to_revision": 1, "auto_approve": True})
    assert (view["operation"], view["phase"], view["revision"]) == ("rollback", "succeeded", 4)
    assert conf.read_text() == "port = 8080\n"
    view = run({"operation": "drift"})
    assert (view["operation"], view["status"]) == ("drift", "completed"), view
    assert view["result"]["drifted"] is False
    view = run({"operation": "destroy", "auto_approve": True})
    assert (view["operation"], view["phase"], view["revision"]) == ("destroy", "succeeded", 5)
    assert not conf.exists()
    listed = http.get(f"{base}/releases", headers=auth("viewer")).json()
    assert [x["operation"] for x in listed] == ["destroy", "rollback", "refresh", "apply", "apply"]
    assert listed[1]["source_revision"] == 1


def test_retry_of_a_paused_run_and_an_idempotent_approve(
    http: httpx.Client, tmp_path: Path
) -> None:
    project = new_project()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must go\n")
    spec = {"resources": [file_resource(blocker / "x", "x\n")]}
    r = http.post(
        f"/v1/stacks/{project}/default/runs",
        json={"operation": "apply", "spec": spec, "on_failure": "pause"},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    wait_run(http, url, lambda v: v["phase"] == "awaitingApproval")
    key = {"Idempotency-Key": "approve-once"}
    first = http.post(f"{url}/approve", headers=auth("admin") | key)
    again = http.post(f"{url}/approve", headers=auth("admin") | key)  # the same Update
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["result"] == first.json()["result"] == "approved by admin"
    paused = wait_run(http, url, lambda v: v["phase"] == "awaitingDecision")
    # the run goes on after its approval: its view names the approver before the release
    # (written when the run ends) does
    assert paused["status"] == "running" and paused["approved_by"] == "admin", paused
    blocker.unlink()  # the fix
    r = http.post(f"{url}/retry", json={"comment": "fixed"}, headers=auth("operator"))
    assert r.status_code == 200 and r.json()["result"] == "retry requested by operator", r.text
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded", view
    assert (blocker / "x").read_text() == "x\n"


def test_a_run_no_worker_polls_for_is_running_with_why(
    http: httpx.Client, api_env: dict[str, str], tmp_path: Path
) -> None:
    """A run on a task queue no worker polls: its status query gets no answer (here it times
    out; Temporal may also refuse it at once, see test_api_closing). Its view still answers:
    running, and why it says no more."""
    import asyncio

    from temporalio.client import Client

    from stackflow.temporal.codec import data_converter
    from stackflow.temporal.operation import OperationInput
    from tests.integration.opshelp import start_run

    project = new_project()

    async def start() -> str:
        client = await Client.connect(
            api_env["TEMPORAL_ADDRESS"],
            namespace=api_env.get("TEMPORAL_NAMESPACE", "default"),
            data_converter=data_converter(),
        )
        request = OperationInput(project=project, spec=small_spec(tmp_path))
        handle = await start_run(client, api_env, request, queue=f"nobody-{uuid.uuid4().hex}")
        assert handle.result_run_id is not None
        return handle.result_run_id

    async def terminate() -> None:
        client = await Client.connect(
            api_env["TEMPORAL_ADDRESS"], namespace=api_env.get("TEMPORAL_NAMESPACE", "default")
        )
        await client.get_workflow_handle(f"stackflow/{project}/default").terminate("test done")

    run_id = asyncio.run(start())
    try:
        r = http.get(f"/v1/stacks/{project}/default/runs/{run_id}", headers=auth("viewer"))
        assert r.status_code == 200, r.text
        view = r.json()
        assert view["status"] == "running", view
        assert "did not answer the status query" in view["error"], view
        assert "worker" in view["error"], view
    finally:
        asyncio.run(terminate())


def test_the_api_make_up_starts(tmp_path: Path) -> None:
    """The `api` service of `make up`, as `make -s env` names it: ready, guarded, and a
    preview run through it to its end."""
    from tests.conftest import DEV_API

    if set(DEV_API) != {"STACKFLOW_API_URL", "STACKFLOW_API_TOKEN"}:
        pytest.fail(
            "STACKFLOW_API_URL and STACKFLOW_API_TOKEN are not set: start the services with "
            '`make up` and `eval "$(make -s env)"` (or run `make test`)',
            pytrace=False,
        )
    url, token = DEV_API["STACKFLOW_API_URL"], DEV_API["STACKFLOW_API_TOKEN"]
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/v1/readyz").status_code == 200
        is_problem(client.get("/v1/stacks/demo/dev/releases"), 401)
        headers = {"Authorization": f"Bearer {token}"}
        r = client.post(
            f"/v1/stacks/{new_project()}/default/runs",
            json={"operation": "preview", "spec": small_spec(tmp_path)},
            headers=headers,
        )
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 90
        while (view := client.get(r.json()["status_url"], headers=headers).json())[
            "status"
        ] == "running":
            assert time.monotonic() < deadline, view
            time.sleep(0.3)
        assert view["status"] == "completed" and view["summary"]["Create"] == 2, view


def test_secrets_are_never_served(http: httpx.Client, tmp_path: Path) -> None:
    """A credential in the spec's ``context.env`` goes through apply and destroy: its value
    is in no answer (run status, preview, releases, release diff, outputs), plain or base64.
    (A Kubernetes Secret's data is masked by the same ``masked_release_data``.)"""
    import base64

    secret = f"api-{uuid.uuid4().hex[:8]}-Sup3r"
    project = new_project()
    base = f"/v1/stacks/{project}/default"
    spec = {"context": {"env": {"API_TEST_TOKEN": secret}}, **small_spec(tmp_path)}
    answers: list[str] = []
    for body in ({"operation": "apply", "spec": spec}, {"operation": "destroy"}):
        r = http.post(f"{base}/runs", json=body, headers=auth())
        assert r.status_code == 201, r.text
        url = r.json()["status_url"]
        view = wait_run(
            http, url, lambda v: v["phase"] == "awaitingApproval" or v["status"] != "running"
        )
        assert view["phase"] == "awaitingApproval", view
        answers.append(http.get(f"{url}/preview", headers=auth()).text)
        assert http.post(f"{url}/approve", headers=auth()).status_code == 200
        view = wait_run(http, url, lambda v: v["status"] != "running")
        assert view["phase"] == "succeeded", view
        answers += [
            http.get(url, headers=auth()).text,
            http.get(f"{url}/preview", headers=auth()).text,
        ]
        answers.append(http.get(f"{base}/outputs", headers=auth()).text)
    for path in ("releases", "releases/1", "releases/2", "releases/1/diff/2", "runs"):
        r = http.get(f"{base}/{path}", headers=auth())
        assert r.status_code == 200, (path, r.text)
        answers.append(r.text)
    served = json.loads(answers[-4])  # release 1 with its spec
    assert set(served["spec"]["context"]["env"]) == {"API_TEST_TOKEN"}
    for text in answers:
        for form in (secret, base64.b64encode(secret.encode()).decode()):
            assert form not in text


def test_four_eyes_self_approval_is_403(http: httpx.Client, tmp_path: Path) -> None:
    """The worker's policy forbids the requester to approve (projects foureyes-*): the same
    caller's approve is a 403 saying so, another approver's goes through."""
    project = f"foureyes-{uuid.uuid4().hex[:8]}"
    r = http.post(
        f"/v1/stacks/{project}/dev/runs",
        json={"operation": "apply", "spec": small_spec(tmp_path)},
        headers=auth("admin"),
    )
    assert r.status_code == 201, r.text
    run = r.json()["status_url"]
    wait_run(http, run, lambda v: v["phase"] == "awaitingApproval")
    body = is_problem(http.post(f"{run}/approve", headers=auth("admin")), 403)
    assert body["type"].endswith("four-eyes") and "admin started this run" in body["detail"]
    assert http.post(f"{run}/reject", headers=auth("admin")).status_code == 200
    view = wait_run(http, run, lambda v: v["status"] != "running")
    assert view["phase"] == "failed" and "rejected by admin" in view["error"]


def test_made_up_methods_leave_metrics_the_same_size(http: httpx.Client) -> None:
    """Through real HTTP, unauthenticated: 1,000 made-up methods are one ``other`` bucket."""

    def sample_lines(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}

    for path in ("/metrics", f"/nowhere/{uuid.uuid4().hex}"):
        http.request("MADEUP", path)
    http.get("/metrics")
    before = http.get("/metrics").text
    for n in range(1000):
        r = http.request(f"M{n}{uuid.uuid4().hex[:6].upper()}", ("/metrics", f"/x/{n}")[n % 2])
        assert r.status_code in (404, 405), r.text
    after = http.get("/metrics").text
    assert sample_lines(after) == sample_lines(before)
    assert len(after) - len(before) < 300, (len(before), len(after))
