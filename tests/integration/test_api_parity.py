# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""What the CLI needs to work through the API alone (issue 42): with STACKFLOW_API_URL set and
nothing else of the services, `drift schedule|status|unschedule`, `release unlock` and
`release export|import` go through a real `stackflow serve` of this checkout (its worker
and state backend the test's) and give what the same command gives directly, with the same
exit code: a Temporal Schedule really made and deleted, an unlock an approver's (an
operator's is a 403) and refused while the holder runs, an export written by either path
byte for byte the same and imported back. And two `stackflow apply` of one stack started
together: one exits 0, the other 3, directly and through the API."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.refs import StackRef
from stackflow.model.drift import schedule_id
from stackflow.temporal.operation import DriftInput
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import (
    DIRECT_ONLY,
    all_releases,
    cli_json,
    file_resource,
    new_project,
    write_spec,
)
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    TOKENS,
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    wait_run,
)

pytestmark = pytest.mark.integration

DRIFT_EXIT = 4


def direct(env: dict[str, str]) -> dict[str, str]:
    """The CLI directly on Temporal and the state backend (never the dev API)."""
    return {k: v for k, v in env.items() if k not in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN")}


def through(env: dict[str, str], url: str, home: Path, who: str = "admin") -> dict[str, str]:
    """A laptop that has only the API: its address and ``who``'s token."""
    out = {k: v for k, v in direct(env).items() if k not in DIRECT_ONLY}
    home.mkdir(parents=True, exist_ok=True)
    out.update(STACKFLOW_HOME=str(home), STACKFLOW_API_URL=url, STACKFLOW_API_TOKEN=TOKENS[who][0])
    return out


def ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def both(
    api_env: dict[str, str], url: str, home: Path, *args: str, code: int = 0
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The command directly and through the API: each with exit ``code``."""
    return (
        ok(run_cli(direct(api_env), *args), code),
        ok(run_cli(through(api_env, url, home), *args), code),
    )


def applied(api_env: dict[str, str], tmp_path: Path, project: str) -> Path:
    """A one-file stack applied directly; the file's path."""
    target = tmp_path / "files" / "a.txt"
    spec = write_spec(tmp_path / "spec.yaml", [file_resource(target, "1\n")])
    ok(run_cli(direct(api_env), "apply", "-f", str(spec), "-p", project, "--yes"))
    return target


async def test_drift_schedule_status_and_unschedule_through_the_api(
    api_env: dict[str, str], api_url: str, tmp_path: Path, temporal_client: Client
) -> None:
    project = new_project()
    stack = StackRef(project, "default")
    laptop = through(api_env, api_url, tmp_path / "laptop")
    target = applied(api_env, tmp_path, project)

    # no report yet: the same line and exit 1 both ways
    none = both(api_env, api_url, tmp_path / "laptop", "drift", "status", "-p", project, code=1)
    assert none[0].stderr == none[1].stderr and "has no drift report yet" in none[1].stderr

    # the check: the same report and exit 4 both ways (but for its run and time)
    target.write_text("changed by hand\n")
    checks = both(api_env, api_url, tmp_path / "laptop", "drift", "check", "-p", project,
                  "-o", "json", code=DRIFT_EXIT)  # fmt: skip
    found = [cli_json(c) for c in checks]
    for data in found:
        assert data.pop("ui").startswith("http") and data.pop("checked_at")
    assert found[0] == found[1] and found[1]["drifted"] is True
    assert (
        checks[0].stderr == checks[1].stderr and "drift found in 1 resource(s)" in checks[1].stderr
    )
    # status reads the same both ways
    for args in (("-o", "json"), ()):
        d, a = both(api_env, api_url, tmp_path / "laptop", "drift", "status", "-p", project, *args)
        assert d.stdout == a.stdout, args
    report = cli_json(ok(run_cli(laptop, "drift", "status", "-p", project, "-o", "json")))
    assert report["drifted"] is True and report["summary"]["drifted"] == 1
    [row] = report["drifted_resources"]
    assert row["id"] == f"onprem:File:{target}"

    # schedule through the API: a Temporal Schedule of the check, requested by the caller
    made = ok(run_cli(laptop, "drift", "schedule", "-p", project, "--every", "1h", "--repair"))
    sid = schedule_id(stack)
    assert made.stdout == (
        f"scheduled drift checks of {stack} every 1h with repair "
        f"(schedule {sid}; `temporal schedule list`)\n"
    )
    described = await temporal_client.get_schedule_handle(sid).describe()
    action = described.schedule.action
    assert (
        action.workflow == "DriftWorkflow"
        and action.task_queue
        == api_env[  # type: ignore[union-attr]
            "STACKFLOW_TASK_QUEUE"
        ]
    )
    [intervals] = described.schedule.spec.intervals
    assert intervals.every.total_seconds() == 3600
    assert described.schedule.state.note == (
        f"stackflow drift schedule {stack.cli_flags} (by admin)"
    )
    [scheduled] = await temporal_client.data_converter.decode(
        action.args,  # type: ignore[union-attr,arg-type]
        [DriftInput],
    )
    assert scheduled == DriftInput(project=project, repair=True, requested_by="admin")

    again = ok(run_cli(laptop, "drift", "schedule", "-p", project, "--every", "30m"))
    assert again.stdout.startswith(f"rescheduled drift checks of {stack} every 30m (")
    [intervals] = (
        await temporal_client.get_schedule_handle(sid).describe()
    ).schedule.spec.intervals
    assert intervals.every.total_seconds() == 1800

    # bad input: the same line and exit 2 both ways, nothing asked of the server
    bad = both(
        api_env,
        api_url,
        tmp_path / "laptop",
        "drift",
        "schedule",
        "-p",
        project,
        "--every",
        "5s",
        code=2,
    )
    assert bad[0].stderr == bad[1].stderr and "at least 10s" in bad[1].stderr

    # an operator's auto-approved repair is refused (403), a plain schedule is theirs
    operator = through(api_env, api_url, tmp_path / "op", who="operator")
    args = ("drift", "schedule", "-p", project, "--every", "1h", "--repair", "--yes")
    refused = ok(run_cli(operator, *args), 2)
    assert "needs approver" in refused.stderr
    ok(run_cli(operator, "drift", "schedule", "-p", project, "--every", "2h"))
    viewer = through(api_env, api_url, tmp_path / "viewer", who="viewer")
    assert "needs operator" in ok(run_cli(viewer, "drift", "unschedule", "-p", project), 2).stderr

    # unschedule: deleted in Temporal; a second time is "no drift schedule" (exit 1)
    gone = ok(run_cli(laptop, "drift", "unschedule", "-p", project))
    assert gone.stdout == f"deleted drift schedule {sid}\n"
    with pytest.raises(RPCError) as missing:
        await temporal_client.get_schedule_handle(sid).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    twice = both(
        api_env, api_url, tmp_path / "laptop", "drift", "unschedule", "-p", project, code=1
    )
    assert twice[0].stderr == twice[1].stderr and "has no drift schedule" in twice[1].stderr

    # and a schedule made directly is deleted through the API, and the reverse
    ok(run_cli(direct(api_env), "drift", "schedule", "-p", project, "--every", "1h"))
    ok(run_cli(laptop, "drift", "unschedule", "-p", project))
    ok(run_cli(laptop, "drift", "schedule", "-p", project, "--every", "1h"))
    ok(run_cli(direct(api_env), "drift", "unschedule", "-p", project))


def test_unlock_is_an_approvers_and_refused_while_the_holder_runs(
    api_env: dict[str, str], api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    project = new_project()
    laptop = tmp_path / "laptop"
    base = f"/v1/stacks/{project}/default"

    # no releases: the same line and exit 1 both ways
    none = both(api_env, api_url, laptop, "release", "unlock", "-p", project, code=1)
    assert none[0].stderr == none[1].stderr == f"Error: stack {project}/default has no releases\n"

    applied(api_env, tmp_path, project)
    idle = both(api_env, api_url, laptop, "release", "unlock", "-p", project)
    assert idle[0].stdout == idle[1].stdout
    assert idle[1].stdout == f"stack {project}/default is not locked (release 1 is succeeded)\n"

    # a run waiting for approval holds the stack
    spec = {"resources": [file_resource(tmp_path / "files" / "b.txt", "b\n")]}
    r = http.post(f"{base}/runs", json={"operation": "apply", "spec": spec}, headers=auth())
    assert r.status_code == 201, r.text
    url = r.json()["status_url"]
    try:
        view = wait_run(http, url, lambda v: v["phase"] == "awaitingApproval")
        assert view["revision"] == 2, view

        # an operator may not unlock (403: exit 2 for the CLI)
        r = http.post(f"{base}/unlock", json={"force": True}, headers=auth("operator"))
        assert "this needs approver" in is_problem(r, 403)["detail"]
        op = through(api_env, api_url, tmp_path / "op", who="operator")
        assert "needs approver" in ok(run_cli(op, "release", "unlock", "-p", project), 2).stderr

        # the holder is alive: refused both ways, exit 3, naming it
        held = both(api_env, api_url, laptop, "release", "unlock", "-p", project, code=3)
        assert held[0].stderr == held[1].stderr
        assert "which is still running" in held[1].stderr and "--force" in held[1].stderr
        r = http.post(f"{base}/unlock", headers=auth("admin"))
        assert is_problem(r, 409)["type"].endswith("stack-locked")

        # --force through the API: unlocked, the release failed saying who did it
        forced = ok(
            run_cli(
                through(api_env, api_url, laptop), "release", "unlock", "-p", project, "--force"
            )
        )
        assert forced.stdout == f"unlocked {project}/default: release 2 is now failed\n"
        last = all_releases(api_env, project)[-1]
        assert last.revision == 2 and last.phase == "failed"
        assert "unlocked by hand by admin with --force while" in (last.error or "")
    finally:
        http.post(f"{url}/cancel", headers=auth())
    r = http.post(f"{base}/unlock", headers=auth("admin"))
    assert r.status_code == 200 and r.json()["unlocked"] is False, r.text


def test_export_and_import_through_the_api_as_directly(
    api_env: dict[str, str], api_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    project = new_project()
    laptop = tmp_path / "laptop"
    first = tmp_path / "files" / "a.txt"
    one = write_spec(tmp_path / "1.yaml", [file_resource(first, "1\n")])
    two = write_spec(
        tmp_path / "2.yaml",
        [file_resource(first, "2\n"), file_resource(tmp_path / "files" / "b.txt", "b\n")],
    )
    for spec in (one, two):
        ok(run_cli(direct(api_env), "apply", "-f", str(spec), "-p", project, "--yes"))
    for workspace in ("default", "other"):
        args = ("release", "export", "-p", project, "--kusion-layout")
        d = ok(run_cli(direct(api_env), *args, str(tmp_path / f"d-{workspace}"), "-w", workspace))
        a = ok(
            run_cli(
                through(api_env, api_url, laptop),
                *args,
                str(tmp_path / f"a-{workspace}"),
                "-w",
                workspace,
            )
        )
        assert d.stdout == a.stdout
    assert a.stdout == "nothing to export\n"
    d_root, a_root = tmp_path / "d-default", tmp_path / "a-default"
    files = sorted(p.relative_to(d_root) for p in d_root.rglob("*") if p.is_file())
    assert [str(p) for p in files] == [
        f"releases/{project}/default/{name}" for name in (".metadata.yml", "1.yaml", "2.yaml")
    ]
    for rel in files:
        assert (a_root / rel).read_bytes() == (d_root / rel).read_bytes(), rel
        assert (a_root / rel).stat().st_mode & 0o777 == 0o600
    no_project = ok(
        run_cli(
            through(api_env, api_url, laptop),
            "release",
            "export",
            "--kusion-layout",
            str(tmp_path / "x"),
        ),
        2,
    )
    assert "--project" in no_project.stderr

    # import the export into a new project: the files renamed as Kusion names them
    target = new_project()
    home = tmp_path / "kusion"
    src = a_root / "releases" / project / "default"
    dst = home / "releases" / target / "default"
    dst.mkdir(parents=True)
    for path in src.iterdir():
        text = path.read_text().replace(f"project: {project}\n", f"project: {target}\n")
        (dst / path.name).write_text(text)
    viewer = through(api_env, api_url, tmp_path / "v", who="operator")
    refused = ok(run_cli(viewer, "release", "import", "--kusion-home", str(home)), 2)
    assert "needs approver" in refused.stderr
    assert http.get(f"/v1/stacks/{target}/default/releases", headers=auth()).json() == []
    done = ok(
        run_cli(through(api_env, api_url, laptop), "release", "import", "--kusion-home", str(home))
    )
    assert done.stdout == f"imported 2 release(s) of {target}/default\n"
    imported = all_releases(api_env, target)
    assert [(r.revision, r.phase) for r in imported] == [(1, "succeeded"), (2, "succeeded")]
    assert [r.id for r in imported[1].state.resources] == [
        f"onprem:File:{first}",
        f"onprem:File:{tmp_path / 'files' / 'b.txt'}",
    ]
    # again: refused both ways (exit 1), nothing written
    again = both(api_env, api_url, laptop, "release", "import", "--kusion-home", str(home), code=1)
    assert (
        again[0].stderr == again[1].stderr and "already has stackflow releases" in again[1].stderr
    )
    assert len(all_releases(api_env, target)) == 2
    # a release of another project in the body: 422, nothing written
    release = http.get(f"/v1/stacks/{target}/default/releases/1", headers=auth()).json()
    body: dict[str, Any] = {"releases": [{**release, "project": "x"}]}
    r = http.post(f"/v1/projects/{new_project()}/releases/import", json=body, headers=auth())
    assert "release of project x" in is_problem(r, 422)["detail"]


def test_state_migrate_through_the_api_says_what_to_do(
    api_env: dict[str, str], api_url: str, tmp_path: Path
) -> None:
    refused = ok(run_cli(through(api_env, api_url, tmp_path / "l"), "state", "migrate"), 2)
    assert "migrated by its workers when they start" in refused.stderr
    assert "--from-dir" in refused.stderr and len(refused.stderr.splitlines()) == 1


@pytest.mark.parametrize("mode", ["direct", "api"])
def test_two_applies_of_one_stack_started_together_exit_0_and_3(
    mode: str,
    api_env: dict[str, str],
    api_url: str,
    http: httpx.Client,
    api_worker: WorkerProcess,
    tmp_path: Path,
) -> None:
    """On a four-eyes project (the worker's STACKFLOW_FOUR_EYES) `apply --yes` waits for
    another approver, so the run that got the stack holds it however late the other CLI
    starts: that one is refused (exit 3); the first ends 0 once approved."""
    project = f"foureyes-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "files"
    spec = write_spec(
        tmp_path / "spec.yaml", [file_resource(root / f"f{i}.txt", f"{i}\n") for i in range(3)]
    )
    if mode == "direct":  # the requester is the user
        env = dict(direct(api_env), USER="fe-approver", LOGNAME="fe-approver")
    else:
        env = through(api_env, api_url, tmp_path / "laptop", who="fe-approver")
    command = [str(REPO / ".venv/bin/stackflow"), "apply", "-f", str(spec), "-p", project, "--yes"]
    procs = [
        subprocess.Popen(
            command,
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "neither apply ended"
            time.sleep(0.2)
        [refused] = [p for p in procs if p.poll() is not None]
        [waiting] = [p for p in procs if p is not refused]
        out, err = refused.communicate()
        assert refused.returncode == 3, out + err
        assert "already has an operation running" in err, err
        base = f"/v1/stacks/{project}/default"
        [run] = http.get(f"{base}/runs", headers=auth("fe-viewer")).json()["runs"]
        url = f"{base}/runs/{run['run_id']}"
        wait_run(http, url, lambda v: v["phase"] == "awaitingApproval")
        assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, out + err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r.phase for r in all_releases(api_env, project)] == ["succeeded"]
    assert sorted(p.name for p in root.iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]


@pytest.mark.parametrize("mode", ["direct", "api"])
def test_an_approve_sent_after_another_approvers_decision_follows_the_run(
    mode: str,
    api_env: dict[str, str],
    api_url: str,
    http: httpx.Client,
    api_worker: WorkerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run command's own approve that reaches the run after another approver decided it
    (the four-eyes wait of `apply --yes`, or a prompt answered late) is not the command's
    failure: it says so and follows the run. It was exit 1 ("approve refused:
    NotAwaitingApproval"), seen when the second approver was quicker than the CLI. The run
    here is held past its approval by a node that fails (``on_failure: pause``)."""
    from stackflow.cli.api_mode import api_client
    from stackflow.cli.output import OutputFormat
    from stackflow.cli.remote import RemoteRun
    from stackflow.client.types import Stack

    project = f"foureyes-{uuid.uuid4().hex[:8]}"
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must go\n")
    spec = {"resources": [file_resource(blocker / "x", "x\n")]}
    runs = f"/v1/stacks/{project}/default/runs"
    body = {"operation": "apply", "spec": spec, "auto_approve": True, "on_failure": "pause"}
    created = http.post(runs, json=body, headers=auth("fe-approver"))
    assert created.status_code == 201, created.text
    url = created.json()["status_url"]
    wait_run(http, url, lambda v: v["phase"] == "awaitingApproval")
    assert http.post(f"{url}/approve", headers=auth("fe-second")).is_success
    wait_run(http, url, lambda v: v["phase"] == "awaitingDecision")

    env = direct(api_env) if mode == "direct" else through(api_env, api_url, tmp_path / "l")
    for name in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("USER", "fe-approver")  # the local caller (direct) is the requester
    with api_client() as client:
        remote = RemoteRun(client, Stack(project, "default"), "ApplyWorkflow", OutputFormat.json)
        remote.run_id = created.json()["run_id"]
        remote.approve(True)
    err = capsys.readouterr().err
    assert f"approve not sent for {project}/default" in err and "awaitingDecision" in err, err
    assert http.post(f"{url}/abort", headers=auth("fe-approver")).is_success
    assert wait_run(http, url, lambda v: v["status"] != "running")["phase"] == "failed"
