"""The policy gate end to end: the real CLI and worker, OPA built by setup, OnPrem files.

A project's pushed bundle and a run's own ``--policy DIR``: deny fails the run before
anything changes (exit 2, naming the policy and the resource), warn shows under the preview
and in the release, require_approval makes ``--yes`` wait for an approver, a bundle that
does not compile fails the run (never a silent pass); the decision is in the release, the
event stream and ``policy eval``'s input document."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx

from stackflow.core.refs import StackRef
from stackflow.model.events import EventType
from stackflow.policy_gate.bundle import BUNDLE_KIND
from tests.gitserver import GitServer
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    cli_json,
    expect_exit,
    file_resource,
    new_project,
    releases,
    write_spec,
)
from tests.integration.test_api import (  # noqa: F401  (fixtures: three tokens)
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    wait_run,
)
from tests.integration.test_cli_api_mode import (  # noqa: F401  (fixtures)
    CALLER,
    Cli,
    api_cli,
    api_server,
)

GATE = """package stackflow

import rego.v1

deny contains {
	"msg": sprintf("%s: content says forbidden; remove the word", [c.id]),
	"resource": c.id,
} if {
	some c in input.changes
	c.action in {"Create", "Update"}
	contains(c.after.content, "forbidden")
}

warn contains {"msg": "world-readable file", "resource": c.id} if {
	some c in input.changes
	c.action == "Create"
	c.after.mode == "0644"
}

require_approval contains {"msg": "deletes a kept file", "resource": c.id} if {
	some c in input.changes
	c.action == "Delete"
	contains(c.before.path, "/keep/")
}
"""


def _bundle(root: Path, name: str, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    return root


def _events(env: dict[str, str], project: str, run_id: str) -> list[dict[str, object]]:
    backend = releases(env)
    try:
        found = backend.events(StackRef(project, "default"), run_id)
    finally:
        backend.close()
    return [{"type": e.type, "data": e.data} for e in found]


def test_a_pushed_bundle_denies_warns_and_asks_for_an_approver(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    expect_exit(
        run_cli(
            env, "policy", "push", "-p", project, str(_bundle(tmp_path / "p", "gate.rego", GATE))
        )
    )
    root = tmp_path / "site"
    keep = file_resource(root / "keep" / "a.conf", "kept\n")
    bad = file_resource(root / "b.conf", "this is forbidden\n")

    # deny: exit 2 naming the policy and the resource; nothing written; release failed
    denied = run_cli(
        env,
        "apply",
        "-f",
        str(write_spec(tmp_path / "bad.yaml", [keep, bad])),
        "-p",
        project,
        "--yes",
    )
    expect_exit(denied, 2)
    assert f"policy denied: project/gate.rego: {bad['id']}: content says forbidden" in denied.stderr
    assert not (root / "keep" / "a.conf").exists() and not (root / "b.conf").exists()
    first = all_releases(env, project)[0]
    assert first.phase == "failed" and first.policy is not None
    assert first.policy.outcome == "deny" and first.policy.counts == {"deny": 1, "warn": 2}
    assert first.policy.bundles[0].scope == "project"
    assert first.state.resources == []
    events = _events(env, project, first.run_id or "")
    decisions = [e for e in events if e["type"] == EventType.policy_decision]
    assert len(decisions) == 1 and decisions[0]["data"]["outcome"] == "deny"  # type: ignore[index]

    # warn: applied; the warnings show under the preview and in release show
    ok = expect_exit(
        run_cli(
            env,
            "apply",
            "-f",
            str(write_spec(tmp_path / "ok.yaml", [keep])),
            "-p",
            project,
            "--yes",
        )
    )
    assert "Policy: warn" in ok.stdout and "world-readable file" in ok.stdout
    shown = cli_json(expect_exit(run_cli(env, "release", "show", "-p", project, "-o", "json")))
    assert shown["policy"]["outcome"] == "warn"
    assert shown["policy"]["messages"][0]["resource"] == keep["id"]
    assert (root / "keep" / "a.conf").read_text() == "kept\n"

    # require_approval: --yes does not approve; another person does
    other = write_spec(tmp_path / "none.yaml", [file_resource(root / "c.conf", "c\n")])
    cmd = [
        str(REPO / ".venv" / "bin" / "stackflow"),
        "apply",
        "-f",
        str(other),
        "-p",
        project,
        "--yes",
        "-o",
        "json",
    ]
    waiting = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = run_cli(env, "status", "-p", project, "-o", "json")
            if (
                status.returncode == 0
                and json.loads(status.stdout).get("phase") == "awaitingApproval"
            ):
                break
            time.sleep(0.3)
        else:
            raise AssertionError("the run did not wait for an approver")
        assert (root / "keep" / "a.conf").exists()
        alice = {**env, "USER": "alice", "LOGNAME": "alice"}
        expect_exit(run_cli(alice, "approve", "-p", project, "--reason", "planned cleanup"))
        out, err = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert "policy requires an approver: project/gate.rego: deletes a kept file" in err
    result = json.loads(out)
    assert result["phase"] == "succeeded" and not (root / "keep" / "a.conf").exists()
    last = all_releases(env, project)[-1]
    assert last.approval is not None and last.approval.by == "alice"
    assert last.policy is not None and last.policy.outcome == "require_approval"


def test_a_runs_own_bundle_eval_and_a_bundle_that_does_not_compile(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    spec = write_spec(
        tmp_path / "s.yaml", [file_resource(tmp_path / "f" / "x.conf", "forbidden\n")]
    )
    run_only = _bundle(tmp_path / "run", "gate.rego", GATE)

    # no policies: the preview passes; with --policy DIR the same preview is denied
    expect_exit(run_cli(env, "preview", "-f", str(spec), "-p", project))
    denied = run_cli(env, "preview", "-f", str(spec), "-p", project, "--policy", str(run_only))
    expect_exit(denied, 2)
    assert "policy denied: run/gate.rego:" in denied.stderr

    # the input document policies read
    doc = cli_json(expect_exit(run_cli(env, "policy", "eval", "-f", str(spec), "-p", project)))
    assert doc["stack"] == {"project": project, "workspace": "default"}
    assert doc["operation"] == "preview" and doc["summary"] == {"Create": 1}
    change = doc["changes"][0]
    assert change["action"] == "Create" and change["after"]["content"] == "forbidden\n"
    assert change["before"] is None and {"path", "old", "new"} <= set(change["diff"][0])
    assert set(doc["time"]) == {"rfc3339", "unix_ns", "weekday", "hour"}

    # policy test against a preview: exit 2 and the messages
    tested = run_cli(
        env,
        "policy",
        "test",
        "--policy",
        str(run_only),
        "-f",
        str(spec),
        "-p",
        project,
        "-o",
        "json",
    )
    expect_exit(tested, 2)
    assert json.loads(tested.stdout)["counts"] == {"deny": 1, "warn": 1}

    # a bundle pushed from a git repository, pinned to the branch's head commit
    other = new_project()
    with GitServer(tmp_path / "policy-repo") as git:
        head = git.commit({"policies/gate.rego": GATE, "policies/gate_test.rego": "x"})
        pushed = run_cli(
            env, "policy", "push", "-p", other, "--git", git.url, "--path", "policies", "-o", "json"
        )
    got = cli_json(expect_exit(pushed))
    assert got["modules"] == ["gate.rego"] and got["source"]["commit"] == head
    from_git = run_cli(env, "preview", "-f", str(spec), "-p", other)
    expect_exit(from_git, 2)
    assert "policy denied: project/gate.rego:" in from_git.stderr

    # a pushed bundle that does not compile fails the run: one line, nothing written
    broken = _bundle(
        tmp_path / "broken", "broken.rego", "package stackflow\n\ndeny contains x if {\n"
    )
    expect_exit(run_cli(env, "policy", "push", "-p", project, str(broken)))
    failed = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes")
    expect_exit(failed, 2)
    assert "policy check failed: policy project/broken.rego:" in failed.stderr
    assert "rego_parse_error" in failed.stderr
    assert not (tmp_path / "f" / "x.conf").exists()
    assert all_releases(env, project)[-1].phase == "failed"


def test_policies_through_the_api(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api_cli: Cli,  # noqa: F811
) -> None:
    """API mode: `policy push`/`show` and `--policy DIR` go through `stackflow serve` (the
    bundle travels inline, the API stores it under the same digest); `--yes` still waits
    for an approver when a policy asks for one."""
    env, project = stack_env, new_project()
    bundle = _bundle(tmp_path / "p", "gate.rego", GATE)
    pushed = cli_json(
        expect_exit(api_cli(env, "policy", "push", "-p", project, str(bundle), "-o", "json"))
    )
    shown = cli_json(expect_exit(api_cli(env, "policy", "show", "-p", project, "-o", "json")))
    assert shown["digest"] == pushed["digest"] and shown["modules"] == ["gate.rego"]
    assert shown["updated_by"] == CALLER
    spec = write_spec(tmp_path / "s.yaml", [file_resource(tmp_path / "f" / "x.conf", "fine\n")])
    extra = _bundle(tmp_path / "run", "more.rego", GATE.replace("forbidden", "fine"))
    denied = api_cli(env, "preview", "-f", str(spec), "-p", project, "--policy", str(extra))
    expect_exit(denied, 2)
    assert "policy denied: run/more.rego:" in denied.stderr
    previewed = expect_exit(api_cli(env, "preview", "-f", str(spec), "-p", project))
    assert "Policy: warn" in previewed.stdout and "project/gate.rego" in previewed.stdout
    expect_exit(api_cli(env, "apply", "-f", str(spec), "-p", project, "--yes"))
    assert (tmp_path / "f" / "x.conf").read_text() == "fine\n"
    missing = api_cli(env, "policy", "show", "-p", new_project())
    expect_exit(missing, 1)
    assert "has no policy bundle" in missing.stderr


# ---- the project's policy holds against the run's (issue 41) -----------------------------------
REVIEWED = """package stackflow

import data.stackflow.lib

deny contains {"msg": sprintf("%s: not reviewed", [c.id]), "resource": c.id} if {
	some c in input.changes
	c.action == "Create"
	not _reviewed
	not lib.approved_change(c)
}

_reviewed if input.requested_by == "reviewer"
"""
REVIEWED_LIB = 'package stackflow.lib\n\napproved_change(c) if c.after.mode == "0600"\n'
EVIL = "package stackflow_gate.p0\n\n_reviewed := true\n"
OVERRIDE_LIB = "package stackflow.lib\n\napproved_change(_) := true\n"
MINE = (
    "package stackflow\n\nimport data.stackflow.lib\n\n"
    'warn contains "mine" if lib.approved_change({})\n'
)


def test_a_crlf_or_indented_project_policy_denies_and_a_run_cannot_switch_it_off(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    pushed = tmp_path / "project"
    pushed.mkdir()
    (pushed / "gate.rego").write_bytes(REVIEWED.replace("\n", "\r\n").encode())  # Windows
    (pushed / "indented.rego").write_text("  " + GATE)
    (pushed / "lib.rego").write_bytes(REVIEWED_LIB.replace("\n", "\r\n").encode())
    expect_exit(run_cli(env, "policy", "push", "-p", project, str(pushed)))
    target = tmp_path / "f" / "x.conf"
    spec = write_spec(tmp_path / "s.yaml", [file_resource(target, "forbidden\n")])

    denied = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes")
    expect_exit(denied, 2)
    assert "policy denied: project/" in denied.stderr and "(and 1 more)" in denied.stderr
    decision = all_releases(env, project)[-1].policy
    assert decision is not None and decision.counts["deny"] == 2
    assert decision.policies == ["project/gate.rego", "project/indented.rego"]

    # a run module in the package the project's first policy is evaluated in: refused
    evil = _bundle(tmp_path / "evil", "evil.rego", EVIL)
    (evil / "mine.rego").write_text("package stackflow\n")
    refused = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "--policy", str(evil))
    expect_exit(refused, 2)
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "evil.rego: package stackflow_gate.p0 is reserved for the policy gate (no module may "
            "declare stackflow_gate or a package under it): a policy starts with `package "
            "stackflow`; a library (any other package) must be imported by a policy of the same "
            "bundle (e.g. `import data.stackflow.lib`)"
        )
    )
    # a stray run module in the project's library package: refused
    stray = _bundle(tmp_path / "stray", "lib.rego", OVERRIDE_LIB)
    (stray / "mine.rego").write_text("package stackflow\n")
    refused = run_cli(env, "preview", "-f", str(spec), "-p", project, "--policy", str(stray))
    expect_exit(refused, 2)
    assert "lib.rego: package stackflow.lib is not `package stackflow` and no policy" in (
        refused.stderr
    )
    # the run's own library of that name, imported by its policy: its own, the project's holds
    own = _bundle(tmp_path / "own", "lib.rego", OVERRIDE_LIB)
    (own / "mine.rego").write_text(MINE)
    still = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "--policy", str(own))
    expect_exit(still, 2)
    assert "policy denied: project/" in still.stderr
    decision = all_releases(env, project)[-1].policy
    assert decision is not None and decision.counts == {"deny": 2, "warn": 2}
    assert [m.policy for m in decision.messages if m.rule == "warn"] == [
        "project/indented.rego",
        "run/mine.rego",
    ]
    assert not target.exists()


def test_a_stored_bundle_with_a_stray_module_fails_the_run_naming_it(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    """A bundle stored before the module checks (written straight into the state backend):
    the worker checks what it evaluates, the run fails with one line, nothing is written."""
    env, project = stack_env, new_project()
    body = json.dumps(
        {"modules": {"gate.rego": GATE, "old.rego": "package stackflow.deny\n"}},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    backend = releases(env)
    try:
        digest = backend.put_blob(BUNDLE_KIND, body)
        backend.bind_policy(project, digest, by="someone-long-ago")
    finally:
        backend.close()
    target = tmp_path / "f" / "x.conf"
    spec = write_spec(tmp_path / "s.yaml", [file_resource(target, "fine\n")])
    failed = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes")
    expect_exit(failed, 2)
    assert (
        f"policy check failed: policy bundle {digest}: old.rego: package stackflow.deny is "
        "not `package stackflow` and no policy of this bundle imports it"
    ) in failed.stderr
    assert not target.exists()


def test_through_http_a_run_cannot_weaken_the_projects_policy(
    http: httpx.Client,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Real HTTP with the approver, operator and viewer tokens: the approver pushes a CRLF
    policy; the operator's run bundles naming the gate's namespace or carrying a stray
    library are 422 problems naming the module; a run with its own library of the
    project's library's name is denied by the project's policy all the same."""
    project = new_project()
    policy_url = f"/v1/projects/{project}/policy"
    crlf = {
        "gate.rego": REVIEWED.replace("\n", "\r\n"),
        "lib.rego": REVIEWED_LIB.replace("\n", "\r\n"),
    }
    is_problem(http.put(policy_url, json={"modules": crlf}, headers=auth("operator")), 403)
    stray = {**crlf, "old.rego": "package stackflow.deny\n"}
    body = is_problem(http.put(policy_url, json={"modules": stray}, headers=auth("admin")), 422)
    assert "old.rego: package stackflow.deny is not `package stackflow`" in body["detail"]
    pushed = http.put(policy_url, json={"modules": crlf}, headers=auth("admin"))
    assert pushed.status_code == 200, pushed.text

    runs = f"/v1/stacks/{project}/default/runs"
    target = tmp_path / "f" / "x.conf"
    spec = {"resources": [file_resource(target, "fine\n")]}

    def start(policy: dict[str, str]) -> httpx.Response:
        request = {"operation": "preview", "spec": spec, "policy": {"modules": policy}}
        return http.post(runs, json=request, headers=auth("operator"))

    for evil, problem in [
        ({"mine.rego": "package stackflow\n", "evil.rego": EVIL}, "evil.rego: package "),
        ({"mine.rego": "package stackflow\n", "lib.rego": OVERRIDE_LIB}, "lib.rego: package "),
        ({"lone.rego": "package stackflow.lib\n\napproved_change(_) := true\n"}, "lone.rego: "),
    ]:
        body = is_problem(start(evil), 422)
        assert problem in body["detail"] and "\n" not in body["detail"], body
    started = start({"mine.rego": MINE, "lib.rego": OVERRIDE_LIB})
    assert started.status_code == 201, started.text
    view = wait_run(http, started.json()["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "failed" and view["error_type"] == "PolicyDenied", view
    assert view["error"].startswith(f"policy denied: project/gate.rego: onprem:File:{target}")
    assert not target.exists()
