# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""Approval is the approver's (issue 41), tried as the people it governs would, through real
HTTP against `stackflow serve` and a worker whose policy makes ``foureyes-*`` four-eyes, with
an operator, two approvers and a viewer on that glob (test_api's TOKENS ``fe-*``):

- an operator's ``auto_approve`` (apply, destroy, rollback, refresh, a drift repair) is a 403
  and starts nothing; so is an operator's apply of a spec that adopts or imports objects;
- on a four-eyes project ``auto_approve`` never skips the wait, whatever the client: an
  approver's API start, the CLI's ``--yes`` (directly on Temporal, or through the API), a
  bare Temporal client, a webhook of a source bound with auto_approve, a drift repair (asked
  through the API, or on a drift schedule); the requester's own approve is refused and
  another approver's applies it;
- a webhook run records the binder, a drift repair who asked for the check or scheduled it;
- a git commit whose spec adopts an object waits for an approver despite auto_approve."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from stackflow.core.refs import StackRef
from stackflow.model.drift import schedule_id
from stackflow.temporal.operation import ApprovalInput, OperationInput
from tests.gitserver import GitServer
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    file_resource,
    new_project,
    start_run,
    wait_phase,
)
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    TOKENS,
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    small_spec,
    wait_run,
)
from tests.integration.test_git_hooks import SECRET, deliver, push_body

pytestmark = pytest.mark.integration


def four_eyes_project() -> str:
    return f"foureyes-{uuid.uuid4().hex[:8]}"


def waiting(http: httpx.Client, url: str) -> dict[str, Any]:
    """The run at ``url`` once it waits for approval (or has ended)."""
    return wait_run(
        http, url, lambda v: v["phase"] == "awaitingApproval" or v["status"] != "running"
    )


def refused_as_requester(http: httpx.Client, url: str, who: str) -> None:
    body = is_problem(http.post(f"{url}/approve", headers=auth(who)), 403)
    assert body["type"].endswith("four-eyes"), body
    assert f"{who} started this run and may not approve it" in body["detail"]


def test_an_operators_auto_approve_is_refused_and_starts_nothing(
    http: httpx.Client, tmp_path: Path
) -> None:
    project = four_eyes_project()
    base = f"/v1/stacks/{project}/dev"
    spec = small_spec(tmp_path)
    conf = tmp_path / "app" / "app.conf"
    for body in (
        {"operation": "apply", "spec": spec, "auto_approve": True},
        {"operation": "apply", "spec_yaml": yaml.safe_dump(spec), "auto_approve": True},
        {"operation": "destroy", "auto_approve": True},
        {"operation": "rollback", "to_revision": 1, "auto_approve": True},
        {"operation": "refresh", "auto_approve": True},
        {"operation": "drift", "repair": True, "auto_approve": True},
    ):
        key = {"Idempotency-Key": uuid.uuid4().hex}
        r = http.post(f"{base}/runs", json=body, headers=auth("fe-operator") | key)
        detail = is_problem(r, 403)["detail"]
        assert detail.startswith(f"auto_approve: fe-operator is operator on project {project}")
        assert "needs approver" in detail, detail
    assert http.get(f"{base}/runs", headers=auth("fe-viewer")).json()["runs"] == []
    assert http.get(f"{base}/releases", headers=auth("fe-viewer")).json() == []
    assert not conf.parent.exists()

    # without auto_approve the start is the operator's: it waits for an approver
    r = http.post(
        f"{base}/runs", json={"operation": "apply", "spec": spec}, headers=auth("fe-operator")
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    view = waiting(http, url)
    assert view["phase"] == "awaitingApproval" and view["requested_by"] == "fe-operator", view
    assert not conf.exists()
    for who in ("fe-viewer", "fe-operator"):
        assert (
            "this needs approver"
            in is_problem(http.post(f"{url}/approve", headers=auth(who)), 403)["detail"]
        )
    assert http.post(f"{url}/approve", headers=auth("fe-approver")).status_code == 200
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded" and view["approved_by"] == "fe-approver", view
    assert conf.read_text() == "port = 8080\n"


def test_an_operator_cannot_apply_a_spec_that_adopts_or_imports(
    http: httpx.Client, tmp_path: Path
) -> None:
    project = four_eyes_project()
    base = f"/v1/stacks/{project}/dev"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "theirs", "namespace": "default"},
        "data": {"a": "1"},
    }
    adopts: dict[str, Any] = {
        "id": "v1:ConfigMap:default:theirs",
        "type": "Kubernetes",
        "attributes": config_map,
        "extensions": {"adopt": True},
    }
    imports: dict[str, Any] = {
        "id": "hashicorp:random:random_password:legacy",
        "type": "Terraform",
        "attributes": {"length": 12},
        "extensions": {
            "provider": "registry.terraform.io/hashicorp/random/3.6.0",
            "resourceType": "random_password",
            "kusionstack.io/import-id": "legacy-password",
        },
    }
    plain = file_resource(tmp_path / "plain.txt", "x\n")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"spec": {"resources": [plain, adopts]}}, adopts["id"], "extensions.adopt"),
        (
            {"spec_yaml": yaml.safe_dump({"resources": [plain, imports]})},
            imports["id"],
            "kusionstack.io/import-id",
        ),
    ]
    for fields, rid, how in cases:
        body = {"operation": "apply", **fields}
        r = http.post(f"{base}/runs", json=body, headers=auth("fe-operator"))
        problem = is_problem(r, 403)
        assert problem["detail"].startswith(f"resource {rid} "), problem
        assert how in problem["detail"] and "fe-operator is operator" in problem["detail"]
        assert problem["resource"] == rid
    assert http.get(f"{base}/runs", headers=auth("fe-viewer")).json()["runs"] == []
    assert not (tmp_path / "plain.txt").exists()


def test_an_approvers_auto_approve_on_a_four_eyes_project_waits_for_another_approver(
    http: httpx.Client, tmp_path: Path
) -> None:
    project = four_eyes_project()
    spec = small_spec(tmp_path)
    conf = tmp_path / "app" / "app.conf"
    r = http.post(
        f"/v1/stacks/{project}/dev/runs",
        json={"operation": "apply", "spec": spec, "auto_approve": True},
        headers=auth("fe-approver"),
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    view = waiting(http, url)
    assert view["phase"] == "awaitingApproval", view  # auto_approve did not skip the wait
    assert view["requested_by"] == "fe-approver" and not conf.exists()
    refused_as_requester(http, url, "fe-approver")
    assert not conf.exists()
    approved = http.post(f"{url}/approve", headers=auth("fe-second"))
    assert approved.status_code == 200 and approved.json()["result"] == "approved by fe-second"
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded" and view["approved_by"] == "fe-second", view
    assert conf.read_text() == "port = 8080\n"


async def test_a_bare_temporal_client_auto_approve_on_a_four_eyes_project_waits(
    api_env: dict[str, str],
    api_worker: WorkerProcess,
    temporal_client: Client,
    tmp_path: Path,
) -> None:
    project = four_eyes_project()
    root = tmp_path / "files"
    spec = {"resources": [file_resource(root / "a.txt", "a\n")]}
    request = OperationInput(project=project, spec=spec, auto_approve=True, operator="alice")
    handle = await start_run(temporal_client, api_env, request)
    await wait_phase(handle, "awaitingApproval")
    assert not root.exists()
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("approve", ApprovalInput(by="alice"))
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "FourEyes"
    assert await handle.execute_update("approve", ApprovalInput(by="bob")) == "approved by bob"
    assert (await handle.result()).phase == "succeeded"
    assert (root / "a.txt").read_text() == "a\n"
    [release] = all_releases(api_env, project)
    assert release.approval is not None and release.approval.by == "bob"

    # a project that is not four-eyes: auto_approve still approves up front
    other = new_project()
    mine = OperationInput(
        project=other,
        spec={"resources": [file_resource(tmp_path / "other.txt", "o\n")]},
        auto_approve=True,
        operator="alice",
    )
    done = await (await start_run(temporal_client, api_env, mine)).result()
    assert done.phase == "succeeded"
    [release] = all_releases(api_env, other)
    assert release.approval is not None and release.approval.by == "alice (auto_approve)"
    for name in (project, other):  # the patch's runs replay
        assert await assert_histories_replay(temporal_client, name, at_least=1) == 1


def test_a_webhook_run_on_a_four_eyes_project_waits_for_an_approver_other_than_the_binder(
    api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    project = four_eyes_project()
    base = f"/v1/stacks/{project}/dev"
    root = tmp_path / "deployed"
    spec = small_spec(root)
    with GitServer(tmp_path / "repo") as git:
        commit = git.commit({"deploy/spec.yaml": yaml.safe_dump(spec)}, "first")
        binding = {
            "url": git.url,
            "path": "deploy/spec.yaml",
            "secret": SECRET,
            "auto_approve": True,
        }
        is_problem(http.put(f"{base}/source", json=binding, headers=auth("fe-operator")), 403)
        assert http.put(f"{base}/source", json=binding, headers=auth("fe-approver")).is_success
        r = deliver(api_url, push_body(git, commit))
        assert r.status_code == 201, r.text
        (run,) = r.json()["runs"]
        view = waiting(http, run["status_url"])  # (the worker fetches the commit)
    assert view["phase"] == "awaitingApproval", view  # the binding's auto_approve: held
    assert view["requested_by"] == "fe-approver"  # the binder, not the pusher octocat
    refused_as_requester(http, run["status_url"], "fe-approver")
    assert not (root / "app" / "app.conf").exists()
    assert http.post(f"{run['status_url']}/approve", headers=auth("fe-second")).is_success
    view = wait_run(http, run["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded" and view["approved_by"] == "fe-second", view
    assert (root / "app" / "app.conf").read_text() == "port = 8080\n"


def applied_by_two(http: httpx.Client, base: str, spec: dict[str, Any]) -> None:
    """The spec applied on a four-eyes stack: started by fe-approver, approved by fe-second."""
    r = http.post(
        f"{base}/runs", json={"operation": "apply", "spec": spec}, headers=auth("fe-approver")
    )
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    waiting(http, url)
    assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
    assert wait_run(http, url, lambda v: v["status"] != "running")["phase"] == "succeeded"


def running_apply(http: httpx.Client, base: str, timeout: float = 90) -> str:
    """The status URL of the stack's running apply, once there is one."""
    deadline = time.monotonic() + timeout
    while True:
        runs = http.get(f"{base}/runs", headers=auth("fe-viewer")).json()["runs"]
        found = [x for x in runs if x["operation"] == "apply" and x["status"] == "running"]
        if found:
            return f"{base}/runs/{found[0]['run_id']}"
        assert time.monotonic() < deadline, f"no running apply: {runs}"
        time.sleep(0.3)


def test_a_drift_repair_records_who_asked_and_waits_for_another_approver(
    http: httpx.Client, tmp_path: Path
) -> None:
    project = four_eyes_project()
    base = f"/v1/stacks/{project}/dev"
    conf = tmp_path / "app" / "app.conf"
    applied_by_two(http, base, small_spec(tmp_path))
    conf.write_text("changed by hand\n")

    r = http.post(
        f"{base}/runs",
        json={"operation": "drift", "repair": True, "auto_approve": True},
        headers=auth("fe-approver"),
    )
    assert r.status_code == 201, r.text
    checked = wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
    assert checked["result"]["drifted"] and checked["result"]["repair_workflow_id"], checked
    url = running_apply(http, base)
    assert waiting(http, url)["phase"] == "awaitingApproval"  # auto_approve held: four-eyes
    refused_as_requester(http, url, "fe-approver")  # who asked for the check requested it
    assert conf.read_text() == "changed by hand\n"
    assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
    view = wait_run(http, url, lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded" and view["approved_by"] == "fe-second", view
    assert conf.read_text() == "port = 8080\n"


async def test_a_scheduled_drift_repair_records_who_scheduled_it(
    api_env: dict[str, str], http: httpx.Client, tmp_path: Path, temporal_client: Client
) -> None:
    """`stackflow drift schedule --repair --yes` (directly on Temporal): each scheduled
    check's repair is requested by who scheduled it, so on a four-eyes project it waits for
    another approver."""
    project = four_eyes_project()
    base = f"/v1/stacks/{project}/dev"
    conf = tmp_path / "app" / "app.conf"
    applied_by_two(http, base, small_spec(tmp_path))
    conf.write_text("changed by hand\n")
    env = cli_env(api_env, USER="fe-approver", LOGNAME="fe-approver")
    args = ["drift", "schedule", "-p", project, "-w", "dev", "--every", "1h", "--repair", "--yes"]
    scheduled = run_cli(env, *args)
    assert scheduled.returncode == 0, scheduled.stdout + scheduled.stderr
    schedule = temporal_client.get_schedule_handle(schedule_id(StackRef(project, "dev")))
    try:
        await schedule.trigger()  # the hour need not pass
        url = running_apply(http, base)
        assert waiting(http, url)["phase"] == "awaitingApproval"
        refused_as_requester(http, url, "fe-approver")
        assert conf.read_text() == "changed by hand\n"
        assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
        view = wait_run(http, url, lambda v: v["status"] != "running")
        assert view["phase"] == "succeeded" and view["approved_by"] == "fe-second", view
        assert conf.read_text() == "port = 8080\n"
    finally:
        await schedule.delete()


def test_a_git_commit_that_adopts_waits_for_an_approver_despite_auto_approve(
    api_url: str, http: httpx.Client, tmp_path: Path, kubeconfig: str
) -> None:
    """The API never reads a commit's spec: the worker finds the adoption and the run waits
    (on a project that is not four-eyes, with a binding that approves pushes up front)."""
    project = new_project()
    base = f"/v1/stacks/{project}/dev"
    name = f"adopt-{uuid.uuid4().hex[:8]}"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"a": "1"},
    }
    rid = f"v1:ConfigMap:default:{name}"
    spec = {
        "resources": [
            {
                "id": rid,
                "type": "Kubernetes",
                "attributes": config_map,
                "extensions": {"adopt": True},
            }
        ]
    }
    with GitServer(tmp_path / "repo") as git:
        commit = git.commit({"deploy/spec.yaml": yaml.safe_dump(spec)}, "adopt")
        binding = {
            "url": git.url,
            "path": "deploy/spec.yaml",
            "secret": SECRET,
            "auto_approve": True,
        }
        assert http.put(f"{base}/source", json=binding, headers=auth("admin")).is_success
        r = deliver(api_url, push_body(git, commit))
        assert r.status_code == 201, r.text
        (run,) = r.json()["runs"]
        view = waiting(http, run["status_url"])  # (the worker fetches the commit)
    assert view["phase"] == "awaitingApproval", view
    rejected = http.post(f"{run['status_url']}/reject", headers=auth("admin"))
    assert rejected.is_success, rejected.text
    view = wait_run(http, run["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "failed" and "rejected by admin" in view["error"], view


# ---- the CLI's --yes on a four-eyes project --------------------------------------------------
class Cli:
    """`stackflow` as a user runs it, its stderr read line by line as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "stackflow"), *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def line_with(self, text: str, timeout: float = 120) -> str:
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                pytest.fail(f"stackflow exited {self.proc.wait()}:\n{''.join(self.err)}")
            self.err.append(line)
            if text in line:
                return line

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def clis() -> Iterator[list[Cli]]:
    started: list[Cli] = []
    yield started
    for cli in started:
        cli.kill()


def cli_env(api_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in api_env.items() if k not in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN")
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("mode", ["direct", "api"])
def test_the_clis_yes_on_a_four_eyes_project_says_it_waits_and_follows(
    mode: str,
    api_env: dict[str, str],
    api_url: str,
    http: httpx.Client,
    tmp_path: Path,
    clis: list[Cli],
) -> None:
    project = four_eyes_project()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(small_spec(tmp_path)))
    if mode == "direct":  # on Temporal itself: the requester is the user
        env = cli_env(api_env, USER="fe-approver", LOGNAME="fe-approver")
    else:
        env = cli_env(
            api_env, STACKFLOW_API_URL=api_url, STACKFLOW_API_TOKEN=TOKENS["fe-operator"][0]
        )
        args = ["apply", "-f", str(spec_file), "-p", project, "-w", "dev", "--yes", "-o", "json"]
        refused = subprocess.run(
            [str(REPO / ".venv" / "bin" / "stackflow"), *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "auto_approve: fe-operator is operator on project" in refused.stderr
        env["STACKFLOW_API_TOKEN"] = TOKENS["fe-approver"][0]
    cli = Cli(env, "apply", "-f", str(spec_file), "-p", project, "-w", "dev", "--yes", "-o", "json")
    clis.append(cli)
    line = cli.line_with("four-eyes")
    assert f"four-eyes: project {project} needs an approver other than fe-approver" in line
    assert f"stackflow approve -p {project} -w dev" in line
    assert not (tmp_path / "app").exists()
    runs = http.get(f"/v1/stacks/{project}/dev/runs", headers=auth("fe-viewer")).json()["runs"]
    [run] = runs
    url = f"/v1/stacks/{project}/dev/runs/{run['run_id']}"
    assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
    code, out = cli.finish()
    assert code == 0, out + "".join(cli.err)
    assert (tmp_path / "app" / "app.conf").read_text() == "port = 8080\n"
    view = http.get(url, headers=auth("fe-viewer")).json()
    assert view["approved_by"] == "fe-second", view
