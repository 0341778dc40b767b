# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""A stack set bound to a set file in a git repository (issue 43, item 5): a repository
served over smart HTTP on 127.0.0.1, signed pushes to `POST /v1/hooks/github` through a
`stackflow serve` and a worker of this tree. One signed push starts one set run that applies
the set file's stacks of that commit in order; the same delivery again, and the same commit
in another delivery, are that run; a bad signature is a 401 that starts nothing; a set file
with a cycle at the pushed commit is one line (problem+json 422) and applies nothing."""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gitserver import GitServer
from tests.integration.conftest import run_cli
from tests.integration.opshelp import DIRECT_ONLY, file_resource
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    wait_run,
)
from tests.integration.test_git_hooks import SECRET, deliver, push_body

pytestmark = pytest.mark.integration


def _files(
    root: Path, name: str, a: str, b: str, content: str, cycle: bool = False
) -> dict[str, str]:
    """The set file (deploy/stacks.yaml) and its two specs: b copies a's file's content
    through a `$stack.` reference, so b can only apply after a."""
    src = file_resource(root / "a.txt", content)
    copy = file_resource(root / "b.txt", f"$stack.{a}/prod.{src['id']}.content")
    stacks = [
        {"project": a, "workspace": "prod", "spec": "a.yaml"},
        {"project": b, "workspace": "prod", "spec": "b.yaml", "dependsOn": [f"{a}/prod"]},
    ]
    if cycle:
        stacks[0]["dependsOn"] = [f"{b}/prod"]
    return {
        "deploy/stacks.yaml": yaml.safe_dump({"name": name, "stacks": stacks}),
        "deploy/a.yaml": yaml.safe_dump({"resources": [src]}),
        "deploy/b.yaml": yaml.safe_dump({"resources": [copy]}),
    }


def test_a_signed_push_applies_the_set_file_of_that_commit_once(
    api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    name, a, b = f"s43h-{tag}", f"s43h-{tag}-a", f"s43h-{tag}-b"
    root = tmp_path / "deployed"
    sets = f"/v1/sets/{name}"
    with GitServer(tmp_path / "repo") as git:
        commit = git.commit(_files(root, name, a, b, "v1\n"), "first")
        binding = {
            "url": git.url,
            "ref": "main",
            "path": "deploy/stacks.yaml",
            "secret": SECRET,
            "auto_approve": True,
        }
        # binding a set needs an approver of every project; what is read back has no secret
        is_problem(http.put(f"{sets}/source", json=binding, headers=auth("operator")), 403)
        is_problem(http.put(f"{sets}/source", json=binding, headers=auth("elsewhere")), 403)
        is_problem(http.get(f"{sets}/source", headers=auth("viewer")), 404)
        r = http.put(f"{sets}/source", json=binding, headers=auth("admin"))
        assert r.status_code == 200, r.text
        shown = http.get(f"{sets}/source", headers=auth("viewer")).json()
        assert shown["path"] == "deploy/stacks.yaml" and "secret" not in shown
        assert SECRET not in r.text

        # a bad signature starts nothing
        body = push_body(git, commit)
        bad = deliver(api_url, body, secret="not-the-secret-of-this-set")
        assert is_problem(bad, 401)["type"].endswith("bad-signature")
        is_problem(http.get(f"{sets}/runs/latest", headers=auth("viewer")), 404)

        # one signed push: one set run; the same delivery at once, and the commit again
        first = deliver(api_url, body, delivery="set-delivery-1")
        assert first.status_code == 201, first.text
        (run,) = first.json()["runs"]
        assert (run["project"], run["workspace"]) == ("@set", name)
        assert run["created"] and run["operation"] == "apply"
        assert run["status_url"] == f"{sets}/runs/{run['run_id']}"
        with ThreadPoolExecutor(3) as pool:
            again = list(
                pool.map(lambda _: deliver(api_url, body, delivery="set-delivery-1"), range(3))
            )
        again.append(deliver(api_url, body, delivery="set-delivery-2"))
        for r in again:
            assert r.status_code == 200, r.text
            assert [(x["run_id"], x["created"]) for x in r.json()["runs"]] == [
                (run["run_id"], False)
            ]

        view = wait_run(http, run["status_url"], lambda v: v["phase"] in ("succeeded", "failed"))
        assert view["phase"] == "succeeded", view
        assert [m["project"] for m in view["members"]] == [a, b]
        assert all(m["phase"] == "succeeded" for m in view["members"]), view
        # b read a's recorded value: a was applied first, from the pushed commit's files
        assert (root / "a.txt").read_text() == (root / "b.txt").read_text() == "v1\n"
        for project in (a, b):
            release = http.get(f"/v1/stacks/{project}/prod/releases/1", headers=auth("viewer"))
            assert release.status_code == 200, release.text

        # a set file with a cycle at the pushed commit: one line, nothing applied
        cyclic = git.commit(_files(root, name, a, b, "v2\n", cycle=True), "cycle")
        for _ in range(2):  # a redelivery is the same refusal, never a run
            refused = deliver(api_url, push_body(git, cyclic))
            detail = is_problem(refused, 422)["detail"]
            assert detail == f"set {name}: a cycle between stacks: {a}/prod -> {b}/prod -> {a}/prod"
        latest = http.get(f"{sets}/runs/latest", headers=auth("viewer")).json()
        assert latest["phase"] == "succeeded" and latest["members"] == view["members"]
        assert (root / "a.txt").read_text() == "v1\n"

        # unbound: the set's pushes start nothing any more
        gone = http.delete(f"{sets}/source", headers=auth("admin"))
        assert gone.status_code == 204, gone.text
        is_problem(deliver(api_url, push_body(git, cyclic)), 401)


def test_set_source_bind_show_unbind_through_the_cli(api_url: str, tmp_path: Path) -> None:
    """`stackflow set source bind|show|unbind --set NAME`, the console script in API mode
    (the typed client): the secret on stdin comes out nowhere; bad input is exit 2, one line."""
    env = {k: v for k, v in os.environ.items() if k not in DIRECT_ONLY}
    env.update(STACKFLOW_API_URL=api_url, STACKFLOW_HOME=str(tmp_path))
    name = f"s43h-cli-{uuid.uuid4().hex[:8]}"
    url = "https://git.example.com/acme/sets.git"
    bind = ("set", "source", "bind", "--set", name, "--url", url, "--path", "sets/all.yaml")
    common = ("--on-push", "preview", "--output", "json")

    env["STACKFLOW_API_TOKEN"] = "operator-token"  # binding a set needs an approver
    denied = run_cli(env, *bind, *common, input=SECRET)
    assert denied.returncode != 0 and "approver" in denied.stderr, denied
    env["STACKFLOW_API_TOKEN"] = "admin-token"
    bad = run_cli(env, *bind, "--on-push", "destroy", input=SECRET)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad
    bound = run_cli(env, *bind, *common, input=SECRET)
    assert bound.returncode == 0, bound.stderr
    assert json.loads(bound.stdout) == {
        "set": name,
        "url": url,
        "ref": "main",
        "path": "sets/all.yaml",
        "on_push": "preview",
        "auto_approve": False,
    }
    shown = run_cli(env, "set", "source", "show", "--set", name)
    assert shown.returncode == 0 and "sets/all.yaml" in shown.stdout, shown.stderr
    assert SECRET not in shown.stdout + bound.stdout + bound.stderr
    gone = run_cli(env, "set", "source", "unbind", "--set", name)
    assert gone.returncode == 0 and "git source removed" in gone.stdout, gone.stderr
    missing = run_cli(env, "set", "source", "show", "--set", name)
    assert missing.returncode != 0 and "has no git source" in missing.stderr, missing
