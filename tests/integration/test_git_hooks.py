# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""Git sources and GitHub push webhooks through real HTTP (issue 22): a repository served over
smart HTTP on 127.0.0.1, a stack bound to a spec file in it, signed pushes to
`POST /v1/hooks/github`. One signed push starts one apply of that commit (fetched by the
worker, recorded in the release); the same delivery sent five times at once and the same
commit pushed again are that run; a bad signature is a 401 that starts nothing; a push to
another branch, or one that does not touch the spec file, is a 202 saying why. A captured
delivery replayed once its key window has passed (its commit no longer the branch's head,
nor newer than the last one a delivery ran) is a 409 that starts nothing; a late delivery
of a newer commit still runs."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stackflow.state.backend import open_backend
from stackflow.state.schema import run_keys
from tests.gitserver import GitServer
from tests.integration.opshelp import dir_resource, file_resource, new_project
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    wait_run,
)

pytestmark = pytest.mark.integration

SECRET = "webhook-secret-for-the-tests-0123"


def spec_text(root: Path, content: str) -> str:
    resources = [
        dir_resource(root),
        file_resource(root / "app.conf", content, deps=[f"onprem:Directory:{root}"]),
    ]
    return yaml.safe_dump({"resources": resources}, sort_keys=False)


def push_body(git: GitServer, commit: str, ref: str = "refs/heads/main", **extra: Any) -> bytes:
    body = {
        "ref": ref,
        "before": "0" * 40,
        "after": commit,
        "repository": {"clone_url": git.url, "html_url": git.url, "full_name": "acme/infra"},
        "pusher": {"name": "octocat"},
        "commits": [{"id": commit, "added": [], "modified": ["deploy/spec.yaml"], "removed": []}],
        **extra,
    }
    return json.dumps(body).encode()


def deliver(
    url: str, body: bytes, *, secret: str = SECRET, delivery: str | None = None, event: str = "push"
) -> httpx.Response:
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature,
    }
    return httpx.post(f"{url}/v1/hooks/github", content=body, headers=headers, timeout=60)


def test_a_signed_push_applies_that_commit_exactly_once(
    api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    project = new_project()
    base = f"/v1/stacks/{project}/dev"
    root = tmp_path / "deployed"
    with GitServer(tmp_path / "repo") as git:
        commit = git.commit({"deploy/spec.yaml": spec_text(root, "port = 1\n")}, "first")
        binding = {"url": git.url, "ref": "main", "path": "deploy/spec.yaml", "secret": SECRET}
        # binding needs an approver; what is read back has no secret
        is_problem(http.put(f"{base}/source", json=binding, headers=auth("operator")), 403)
        r = http.put(f"{base}/source", json=binding, headers=auth("admin"))
        assert r.status_code == 200, r.text
        shown = http.get(f"{base}/source", headers=auth("viewer")).json()
        assert shown["url"] == git.url and "secret" not in shown and SECRET not in r.text

        # a bad signature starts nothing
        body = push_body(git, commit)
        bad = deliver(api_url, body, secret="not-the-secret-of-this-stack")
        assert is_problem(bad, 401)["type"].endswith("bad-signature")
        assert http.get(f"{base}/runs", headers=auth("viewer")).json()["runs"] == []

        # one signed push: one apply run of that commit
        first = deliver(api_url, body, delivery="delivery-1")
        assert first.status_code == 201, first.text
        (run,) = first.json()["runs"]
        assert run["created"] and run["operation"] == "apply" and first.json()["commit"] == commit
        # the same delivery five times at once, and the same commit pushed again: that run
        with ThreadPoolExecutor(5) as pool:
            again = list(
                pool.map(lambda _: deliver(api_url, body, delivery="delivery-1"), range(5))
            )
        again.append(deliver(api_url, body, delivery="delivery-2"))
        for r in again:
            assert r.status_code == 200, r.text
            assert [x["run_id"] for x in r.json()["runs"]] == [run["run_id"]]
            assert not r.json()["runs"][0]["created"]

        # another branch, and a push that does not touch the spec file: ignored, saying why
        other = git.commit({"deploy/spec.yaml": spec_text(root, "port = 2\n")}, "b", "feature")
        r = deliver(api_url, push_body(git, other, ref="refs/heads/feature"))
        assert r.status_code == 202 and r.json()["runs"] == []
        assert "not refs/heads/main" in r.json()["ignored"][0]["reason"]
        readme = git.commit({"README.md": "docs\n"}, "docs")
        docs = push_body(git, readme, commits=[{"id": readme, "modified": ["README.md"]}])
        r = deliver(api_url, docs)
        assert r.status_code == 202 and "do not change deploy/spec.yaml" in r.text

        view = wait_run(http, run["status_url"], lambda v: v["phase"] == "awaitingApproval")
        # the requester is who bound the stack (admin), not the pusher: four-eyes holds
        assert view["requested_by"] == "admin" and view["summary"]["Create"] == 2
        approved = http.post(f"{run['status_url']}/approve", headers=auth("admin"))
        assert approved.status_code == 200, approved.text
        view = wait_run(http, run["status_url"], lambda v: v["status"] != "running")
        assert view["phase"] == "succeeded", view
        assert (root / "app.conf").read_text() == "port = 1\n"
        release = http.get(f"{base}/releases/1", headers=auth("viewer")).json()
        assert release["source"] == {"url": git.url, "commit": commit, "path": "deploy/spec.yaml"}
        runs = http.get(f"{base}/runs", headers=auth("viewer")).json()["runs"]
        assert [r["run_id"] for r in runs] == [run["run_id"]]  # one run in all

        # the same commit told by a CloudEvent after the run ended: still that run
        event = {
            "specversion": "1.0",
            "id": "ce-1",
            "source": "/ci/acme",
            "type": "com.example.git.push",
            "datacontenttype": "application/json",
            "data": {"repository": git.url, "ref": "refs/heads/main", "commit": commit},
        }
        raw = json.dumps(event).encode()
        mac = hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        hook = f"{api_url}/v1/hooks/generic"
        wrong = httpx.post(hook, content=raw, headers={"X-Stackflow-Signature": "sha256=00"})
        is_problem(wrong, 401)
        told = httpx.post(hook, content=raw, headers={"X-Stackflow-Signature": f"sha256={mac}"})
        assert told.status_code == 200, told.text
        assert [r["run_id"] for r in told.json()["runs"]] == [run["run_id"]]

        # a run of an exact commit through the API: the worker fetches the bound branch, then
        # a commit not on it by its id, where the host serves it (a branch's tip here; any
        # commit on GitHub or with git's protocol v2): an earlier commit of main and the
        # feature branch's tip are previewed, a commit below another branch's tip is one line
        older = git.commit({"deploy/spec.yaml": spec_text(root, "port = 3\n")}, "c")
        git.commit({"README.md": "more docs\n"}, "docs again")
        for exact in (older, other):
            r = http.post(
                f"{base}/runs",
                json={"operation": "preview", "commit": exact},
                headers=auth("operator"),
            )
            assert r.status_code == 201, r.text
            done = wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
            assert done["status"] == "completed" and done["summary"]["Update"] == 1, done
        below = git.commit({"deploy/spec.yaml": spec_text(root, "port = 4\n")}, "d", "feature")
        git.commit({"deploy/spec.yaml": spec_text(root, "port = 5\n")}, "e", "feature")
        r = http.post(
            f"{base}/runs",
            json={"operation": "preview", "commit": below},
            headers=auth("operator"),
        )
        assert r.status_code == 201, r.text
        done = wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
        assert done["status"] == "failed", done
        assert f"commit {below} is not in the repository's refs/heads/main" in done["error"]
        assert "the host serves no other commit by id" in done["error"]
        missing = "f" * 40
        r = http.post(
            f"{base}/runs", json={"operation": "preview", "commit": missing}, headers=auth()
        )
        assert r.status_code == 201
        failed = wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
        assert failed["status"] == "failed" and "is not in the repository" in failed["error"]


def test_a_commit_needs_a_bound_stack(http: httpx.Client) -> None:
    r = http.post(
        f"/v1/stacks/{new_project()}/dev/runs",
        json={"operation": "apply", "commit": "a" * 40},
        headers=auth("operator"),
    )
    assert "has no git source" in is_problem(r, 422)["detail"]
    r = http.post(
        f"/v1/stacks/{new_project()}/dev/runs",
        json={"operation": "apply", "commit": "a" * 40, "spec_yaml": "resources: []"},
        headers=auth("operator"),
    )
    assert "give one of them" in is_problem(r, 422)["detail"]


def test_a_replayed_old_delivery_starts_nothing(
    api_env: dict[str, str], api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    project = new_project()
    base = f"/v1/stacks/{project}/dev"
    root = tmp_path / "deployed"
    with GitServer(tmp_path / "repo") as git:
        binding = {
            "url": git.url,
            "ref": "main",
            "path": "deploy/spec.yaml",
            "secret": SECRET,
            "on_push": "preview",
        }
        r = http.put(f"{base}/source", json=binding, headers=auth("admin"))
        assert r.status_code == 200, r.text

        def pushed(content: str) -> tuple[str, bytes, dict[str, Any]]:
            commit = git.commit({"deploy/spec.yaml": spec_text(root, content)}, content)
            body = push_body(git, commit)
            r = deliver(api_url, body)
            assert r.status_code == 201, r.text
            (run,) = r.json()["runs"]
            wait_run(http, run["status_url"], lambda v: v["status"] != "running")
            return commit, body, run

        first, captured, run1 = pushed("port = 1\n")
        second, _, run2 = pushed("port = 2\n")
        # a day passes: the first delivery's Idempotency-Key window is over (its claim aged
        # in the state backend as a day would), and it is replayed, signature and all
        state = open_backend(api_env["STACKFLOW_STATE_URL"])
        try:
            with state.engine.begin() as conn:
                conn.execute(
                    run_keys.update()
                    .where(run_keys.c.project == project)
                    .values(created_at=run_keys.c.created_at - timedelta(hours=25))
                )
        finally:
            state.close()
        replay = deliver(api_url, captured, delivery=str(uuid.uuid4()))
        detail = is_problem(replay, 409)["detail"]
        assert detail == (
            f"stack {project}/dev: commit {first[:12]} is not the head of refs/heads/main "
            f"(now {second[:12]}) nor newer than {second[:12]}, the last commit a delivery "
            "ran: an old delivery, replayed or late; nothing started"
        )
        runs = http.get(f"{base}/runs", headers=auth("viewer")).json()["runs"]
        assert sorted(r["run_id"] for r in runs) == sorted([run1["run_id"], run2["run_id"]])

        # a late delivery of a newer commit (the branch moved on before it came) still runs
        third = git.commit({"deploy/spec.yaml": spec_text(root, "port = 3\n")}, "third")
        git.commit({"README.md": "docs\n"}, "docs")
        late = deliver(api_url, push_body(git, third))
        assert late.status_code == 201, late.text
        assert late.json()["commit"] == third and late.json()["runs"][0]["created"]
