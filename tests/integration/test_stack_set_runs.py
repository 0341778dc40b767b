"""Set runs of OnPrem stacks on the dev services, with a worker of this tree: one approval
covering the set, ``set status``, a bare Temporal start (inline specs; bad input fails the
run), a reference to a field the upstream never recorded, and set runs meeting a busy stack
(fail fast naming the holder, never a deadlock, no stack left locked)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client, WorkflowFailureError

from stackflow.core.refs import StackRef
from stackflow.model.release import Phase
from stackflow.temporal.operation import OperationInput, workflow_id_for
from stackflow.temporal.stack_set import SetView, set_workflow_id
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, file_resource, poll, releases, wait_phase


def _set(root: Path, name: str, stacks: dict[str, list[dict[str, Any]]], deps: Any = None) -> Path:
    """A set file of OnPrem stacks (project -> resources), workspace prod."""
    members = []
    for project, resources in stacks.items():
        (root / f"{project}.yaml").write_text(yaml.safe_dump({"resources": resources}))
        member = {"project": project, "workspace": "prod", "spec": f"{project}.yaml"}
        if deps and project in deps:
            member["dependsOn"] = deps[project]
        members.append(member)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "stacks": members}))
    return path


def _by(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["project"]: m for m in view["members"]}


def _sse(url: str, path: str, token: str, last: int) -> list[tuple[str, str | None]]:
    """An SSE stream resumed after ``last`` (``Last-Event-ID``): its (event, id) pairs."""
    import urllib.error
    import urllib.request

    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "text/event-stream",
        "Last-Event-ID": str(last),
    }
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers)) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as exc:
        return [(str(exc.code), None)]
    found = []
    for message in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in message.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields["event"], fields.get("id")))
    return found


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def test_one_approval_covers_the_set_and_status_shows_it(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, tag = stack_env, _tag()
    a, b = f"seta{tag}", f"setb{tag}"
    src = file_resource(tmp_path / "a.txt", "from a\n")
    copy = file_resource(tmp_path / "b.txt", f"$stack.{a}/prod.{src['id']}.content")
    path = _set(tmp_path, f"pair-{tag}", {a: [src], b: [copy]})
    # a "no" leaves everything as it was
    proc = run_cli(env, "set", "apply", "-f", str(path), "-o", "json", input="n\n")
    assert proc.returncode == 1, proc.stderr
    assert "set apply rejected by" in proc.stderr
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    # a "yes": one approval, both stacks applied in order, the value passed on
    wide = {**env, "COLUMNS": "400"}
    proc = run_cli(wide, "set", "apply", "-f", str(path), "-o", "json", input="y\n")
    assert proc.returncode == 0, proc.stderr
    assert "(known after apply)" not in proc.stdout
    assert f"$stack.{a}/prod.{src['id']}.content" in proc.stderr  # the combined preview
    view = _by(cli_json(proc))
    assert view[a]["phase"] == view[b]["phase"] == "succeeded"
    assert (tmp_path / "b.txt").read_text() == "from a\n"
    started = re.search(r"set run: stackflow-set/pair-\S+ \(([0-9a-f-]+)\)", proc.stderr)
    assert started is not None, proc.stderr
    backend = releases(env)
    try:
        for project in (a, b):
            [release] = backend.list(StackRef(project, "prod"))
            assert release.approval is not None and "(auto_approve)" in release.approval.by
            assert release.set_run == f"pair-{tag}/{started[1]}"  # the set run that made it
    finally:
        backend.close()
    listed = run_cli(env, "release", "list", "-p", a, "-w", "prod", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["set_run"] for r in cli_json(listed)] == [f"pair-{tag}/{started[1]}"]
    status = run_cli(env, "set", "status", "--set", f"pair-{tag}", "-o", "json")
    assert status.returncode == 0, status.stderr
    shown = cli_json(status)
    assert shown["phase"] == "succeeded" and _by(shown)[b]["revision"] == 1
    events = run_cli(env, "set", "events", "--set", f"pair-{tag}")
    assert events.returncode == 0, events.stderr
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))  # one numbering
    starts = [(e["stack"], e["operation"]) for e in lines if e["type"] == "run_start"]
    assert sorted(starts) == sorted(
        (f"{p}/prod", op) for p in (a, b) for op in ("preview", "apply")
    ), starts
    assert sum(e["type"] == "stack_complete" for e in lines) == 4
    assert lines[-1]["type"] == "run_complete" and lines[-1]["status"] == "succeeded"
    for stack in (f"{a}/prod", f"{b}/prod"):  # each stack's events in its own order
        runs = {e["run_id"] for e in lines if e.get("stack") == stack}
        assert len(runs) == 2
        for run in runs:  # a run's own end comes after its events
            assert [e for e in lines if e.get("run_id") == run][-1]["type"] == "stack_complete"
    again = run_cli(env, "set", "events", "--set", f"pair-{tag}", "--after", "3")
    assert again.returncode == 0, again.stderr
    assert [json.loads(x) for x in again.stdout.splitlines()] == lines[3:]  # no gap, no copy
    late = run_cli(env, "set", "approve", "--set", f"pair-{tag}")
    assert late.returncode == 1 and "no running run to approve" in late.stderr, late.stderr
    # a stack another stack still reads is not destroyed without it
    alone = _set(tmp_path, f"alone-{tag}", {a: [src]})
    refused = run_cli(env, "set", "destroy", "-f", str(alone), "--yes")
    assert refused.returncode == 2, refused.stderr
    assert f"destroy {a}/prod: {b}/prod (outside the set) still reads it" in refused.stderr
    assert (tmp_path / "a.txt").exists()
    gone = run_cli(env, "set", "destroy", "-f", str(path), "--yes", "-o", "json")
    assert gone.returncode == 0, gone.stderr
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()


async def test_a_bare_start_is_validated_and_runs_inline_specs(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    tag, queue = _tag(), stack_env["STACKFLOW_TASK_QUEUE"]
    bad = await temporal_client.start_workflow(
        "SetWorkflow", {"name": f"bad-{tag}", "members": "nope"}, id=f"bad-{tag}", task_queue=queue
    )
    with pytest.raises(WorkflowFailureError) as err:
        await bad.result()
    cause: Any = err.value.cause
    assert cause.type == "InvalidInput"
    assert cause.message.startswith("invalid workflow input: members: Input should be a valid list")
    a = f"seti{tag}"
    src = file_resource(tmp_path / "i.txt", "inline\n")
    ok = await temporal_client.start_workflow(
        "SetWorkflow",
        {
            "name": f"inline-{tag}",
            "auto_approve": True,
            "members": [{"project": a, "workspace": "prod", "spec": {"resources": [src]}}],
        },
        id=set_workflow_id(f"inline-{tag}"),
        task_queue=queue,
        result_type=SetView,
    )
    view = await ok.result()
    assert view.phase == "succeeded" and (tmp_path / "i.txt").read_text() == "inline\n"
    # the parent's history holds refs, never the spec's values past its own input
    async for event in ok.fetch_history_events():
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            attrs = event.start_child_workflow_execution_initiated_event_attributes
            from tests.integration.opshelp import payload_json_async

            child = await payload_json_async(attrs.input.payloads[0])
            assert child["spec"] is None and child["spec_ref"].startswith("sha256:")


async def test_a_bad_set_fails_a_bare_start_in_one_line_before_anything_runs(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    tag, queue = _tag(), stack_env["STACKFLOW_TASK_QUEUE"]
    a, b = f"s43-a{tag}", f"s43-b{tag}"

    def member(project: str, content: str, deps: list[str] | None = None) -> dict[str, Any]:
        resource = file_resource(tmp_path / project, content)
        return {"project": project, "spec": {"resources": [resource]}, "depends_on": deps or []}

    bad = {
        "cycle": [member(a, "a\n", [f"{b}/default"]), member(b, "b\n", [f"{a}/default"])],
        "unknown stack": [member(a, "a\n", ["s43-nope/default"])],
        "no resource": [member(a, "a\n"), member(b, f"$stack.{a}/default.onprem:File:/x.content")],
    }
    said = {}
    for what, members in bad.items():
        name = f"s43-bad-{tag}-{what.replace(' ', '-')}"
        handle = await temporal_client.start_workflow(
            "SetWorkflow",
            {"name": name, "auto_approve": True, "members": members},
            id=set_workflow_id(name),
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        cause: Any = err.value.cause
        assert cause.type == "SpecError", (what, cause)
        said[what] = cause.message
        assert "\n" not in cause.message
    assert said["cycle"].startswith(f"set s43-bad-{tag}-cycle: a cycle between stacks: ")
    assert said["unknown stack"].endswith("dependsOn s43-nope/default: not a stack of the set")
    assert said["no resource"].endswith(f"stack {a}/default has no such resource"), said
    assert not (tmp_path / a).exists() and not (tmp_path / b).exists()  # nothing applied
    backend = releases(stack_env)
    try:
        assert backend.list(StackRef(a, "default")) == backend.list(StackRef(b, "default")) == []
    finally:
        backend.close()


def test_a_missing_field_fails_the_reader_before_anything_changes(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, tag = stack_env, _tag()
    a, b = f"setm{tag}", f"setn{tag}"
    src = file_resource(tmp_path / "m.txt", "m\n")
    assert (
        run_cli(
            env, "apply", "-p", a, "-w", "prod", "-f", str(_spec(tmp_path, src)), "--yes"
        ).returncode
        == 0
    )
    reader = file_resource(tmp_path / "n.txt", f"$stack.{a}/prod.{src['id']}.nope")
    path = _set(tmp_path, f"miss-{tag}", {a: [src], b: [reader]})
    proc = run_cli(env, "set", "apply", "-f", str(path), "-o", "json", input="y\n")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: {b}/prod: $stack.{a}/prod.{src['id']}.nope: "), line
    assert line.endswith(f"{src['id']!r} of {a}/prod has no field nope"), line
    assert not (tmp_path / "n.txt").exists()


def _spec(root: Path, *resources: dict[str, Any]) -> Path:
    path = root / f"spec-{_tag()}.yaml"
    path.write_text(yaml.safe_dump({"resources": list(resources)}))
    return path


async def test_a_busy_stack_fails_fast_and_two_sets_never_deadlock(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env, tag = stack_env, _tag()
    shared, other = f"sets{tag}", f"seto{tag}"
    one = file_resource(tmp_path / "s.txt", "s\n")
    two = file_resource(tmp_path / "o.txt", "o\n")
    # a run of the shared stack waits for approval, holding it
    held = await temporal_client.start_workflow(
        "ApplyWorkflow",
        OperationInput(project=shared, workspace="prod", spec={"resources": [one]}),
        id=workflow_id_for(StackRef(shared, "prod")),
        task_queue=env["STACKFLOW_TASK_QUEUE"],
    )
    await wait_phase(held, Phase.awaitingApproval, timeout=60)
    path = _set(tmp_path, f"busy-{tag}", {shared: [one], other: [two]})
    proc = run_cli(env, "set", "apply", "-f", str(path), "--yes", "-o", "json")
    assert proc.returncode == 1, proc.stderr
    view = _by(cli_json(proc))
    assert view[shared]["phase"] == "failed" and view[shared]["error_type"] == "StackLocked"
    assert f"stackflow/{shared}/prod is already running" in view[shared]["error"]
    assert view[other]["phase"] == "succeeded"  # independent stacks go on
    await held.execute_update("reject", {"by": "test"})
    # two set runs sharing a stack, started at once: both end, nothing stays locked
    paths = [
        _set(
            tmp_path,
            f"race{i}-{tag}",
            {shared: [one], f"setr{i}{tag}": [file_resource(tmp_path / f"r{i}", "r\n")]},
        )
        for i in (1, 2)
    ]
    procs = [
        subprocess.Popen(
            [
                str(REPO / ".venv/bin/stackflow"),
                "set",
                "apply",
                "-f",
                str(p),
                "--yes",
                "-o",
                "json",
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in paths
    ]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode in (0, 1), err
        outcomes.append(_by(json.loads(out))[shared])
    for outcome in outcomes:
        assert outcome["phase"] == "succeeded" or outcome["error_type"] == "StackLocked", outcome
    assert any(o["phase"] == "succeeded" for o in outcomes)
    backend = releases(env)
    try:
        assert backend.lock(StackRef(shared, "prod")) is None
        assert all(r.phase.is_final for r in backend.list(StackRef(shared, "prod")))
    finally:
        backend.close()
    await asyncio.sleep(0)


async def test_four_eyes_holds_for_the_set_and_its_approval_reaches_the_members(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    tag = _tag()
    env = {**stack_env, "STACKFLOW_FOUR_EYES": f"setf{tag}*"}
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        a = f"setf{tag}"
        path = _set(tmp_path, f"four-{tag}", {a: [file_resource(tmp_path / "f.txt", "f\n")]})
        cli = subprocess.Popen(
            [str(REPO / ".venv/bin/stackflow"), "set", "apply", "-f", str(path), "-o", "json"],
            env=env,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert cli.stdin is not None
        cli.stdin.write("y\n")
        cli.stdin.flush()
        handle = temporal_client.get_workflow_handle(set_workflow_id(f"four-{tag}"))

        async def awaiting() -> SetView | None:
            view = await handle.query("status", result_type=SetView)
            return view if view.phase == "awaitingApproval" else None

        await poll(awaiting, timeout=60, what="the set's approval wait")
        await asyncio.sleep(2)  # the requester's own approval is refused meanwhile
        assert (await handle.query("status", result_type=SetView)).phase == "awaitingApproval"
        await handle.execute_update("approve", {"by": "bob"})
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, err
        assert "four-eyes" in err and f"stackflow set approve --set four-{tag}" in err
        assert _by(json.loads(out))[a]["phase"] == "succeeded"
        # the member's run, four-eyes too, was given the set's approval: bob's
        backend = releases(env)
        try:
            [release] = backend.list(StackRef(a, "prod"))
            assert release.approval is not None and release.approval.by == "bob"
        finally:
            backend.close()
    finally:
        worker.stop()


async def test_the_api_starts_reads_and_approves_a_set(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    import hashlib

    import httpx

    from stackflow.api.app import create_app
    from stackflow.api.auth import parse_tokens

    tag = _tag()
    a, b = f"setx{tag}", f"sety{tag}"
    roles = {
        "ann": {f"set?{tag}": "approver"},
        "vic": {"*": "operator"},
        "zed": {f"setx{tag}": "viewer"},  # a viewer of one member only
    }
    table = parse_tokens(
        json.dumps(
            [
                {"name": n, "sha256": hashlib.sha256(n.encode()).hexdigest(), "roles": r}
                for n, r in roles.items()
            ]
        )
    )

    async def connect() -> Client:
        return temporal_client

    backend = releases(stack_env)
    app = create_app(connect, backend, table, task_queue=stack_env["STACKFLOW_TASK_QUEUE"])
    src = file_resource(tmp_path / "x.txt", "from x\n")
    reader = file_resource(tmp_path / "y.txt", f"$stack.{a}/default.{src['id']}.content")
    body = {
        "operation": "apply",
        "members": [
            {"project": a, "spec": {"resources": [src]}},
            {"project": b, "spec": {"resources": [reader]}},
        ],
    }
    ann, vic = {"Authorization": "Bearer ann"}, {"Authorization": "Bearer vic"}
    name = f"api-{tag}"
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as http:
            created = await http.post(f"/v1/sets/{name}/runs", json=body, headers=vic)
            assert created.status_code == 201, created.text
            url = created.json()["status_url"]

            async def phase(wanted: str) -> dict[str, Any] | None:
                got = await http.get(url, headers=ann)
                assert got.status_code == 200, got.text
                view: dict[str, Any] = got.json()
                return view if view["phase"] == wanted else None

            await poll(lambda: phase("awaitingApproval"), timeout=60, what="the approval wait")
            refused = await http.post(f"{url}/approve", headers=vic)
            assert refused.status_code == 403, refused.text
            assert "vic is operator on project" in refused.json()["detail"]
            approved = await http.post(f"{url}/approve", headers=ann)
            assert approved.status_code == 200, approved.text
            view = await poll(lambda: phase("succeeded"), timeout=90, what="the set's end")
            assert [m["phase"] for m in view["members"]] == ["succeeded", "succeeded"]
            assert (tmp_path / "y.txt").read_text() == "from x\n"

            # the web UI's set page: the run and its stacks, for a viewer of every member
            async def ui_page(token: str, path: str) -> httpx.Response:
                http.cookies.clear()
                login = await http.get("/ui/login")
                csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
                assert csrf is not None, login.text
                form = {"csrf": csrf.group(1), "token": token, "next": "/ui/"}
                assert (await http.post("/ui/login", data=form)).status_code == 303
                return await http.get(path)

            page = await ui_page("ann", f"/ui/sets/{name}")
            assert page.status_code == 200, page.text
            assert f"/ui/s/{a}/default" in page.text and f"/ui/s/{b}/default" in page.text
            assert page.text.count(">succeeded<") == 3  # the set and its two stacks
            opened = await http.get(f"/ui/sets?name={name}")
            assert opened.status_code == 303 and opened.headers["location"].endswith(name)
            hidden = await ui_page("zed", f"/ui/sets/{name}")
            assert hidden.status_code == 403 and f"project {b}" in hidden.text
    finally:
        backend.close()


async def test_a_paused_set_retries_its_failed_stacks(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env, tag = stack_env, _tag()
    first, after, other = f"setp{tag}", f"setq{tag}", f"setr{tag}"
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must be\n")
    path = _set(
        tmp_path,
        f"pause-{tag}",
        {
            first: [file_resource(blocker / "f", "f\n")],
            after: [file_resource(tmp_path / "after.txt", "after\n")],
            other: [file_resource(tmp_path / "other.txt", "other\n")],
        },
        deps={after: [f"{first}/prod"]},
    )
    paused = run_cli(env, "set", "apply", "-f", str(path), "--yes", "--on-failure", "pause")
    assert paused.returncode == 4, paused.stderr
    assert f"stackflow set retry --set pause-{tag}" in paused.stderr
    handle = temporal_client.get_workflow_handle(
        set_workflow_id(f"pause-{tag}"), result_type=SetView
    )
    view = await handle.query("status", result_type=SetView)
    phases = {m.project: m.phase for m in view.members}
    assert view.phase == "awaitingDecision"
    assert phases == {first: "failed", after: "skipped", other: "succeeded"}
    blocker.unlink()  # what failed is fixed: the retry runs the failed and skipped stacks
    retried = run_cli(env, "set", "retry", "--set", f"pause-{tag}")
    assert retried.returncode == 0, retried.stderr
    done = await handle.result()
    assert done.phase == "succeeded", done.error
    assert (blocker / "f").read_text() == "f\n" and (tmp_path / "after.txt").exists()
    backend = releases(env)
    try:  # the stack that had succeeded was not run again
        assert len(backend.list(StackRef(other, "prod"))) == 1
        assert [r.phase for r in backend.list(StackRef(first, "prod"))] == ["failed", "succeeded"]
    finally:
        backend.close()


def test_the_cli_through_the_api(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    import hashlib

    from tests.integration.opshelp import DIRECT_ONLY
    from tests.integration.test_api import ApiServer

    tag = _tag()
    a, b = f"setu{tag}", f"setv{tag}"
    tokens = tmp_path / "tokens.json"
    digest = hashlib.sha256(b"ops-token").hexdigest()
    tokens.write_text(
        json.dumps([{"name": "ops", "sha256": digest, "roles": {"set*": "approver"}}])
    )
    server = ApiServer({**stack_env, "STACKFLOW_API_TOKENS": str(tokens)}, tmp_path / "api.log")
    server.start()
    try:
        cli = {k: v for k, v in stack_env.items() if k not in DIRECT_ONLY}
        cli.update(STACKFLOW_API_URL=server.url, STACKFLOW_API_TOKEN="ops-token")
        src = file_resource(tmp_path / "u.txt", "from u\n")
        reader = file_resource(tmp_path / "v.txt", f"$stack.{a}/prod.{src['id']}.content")
        path = _set(tmp_path, f"api-cli-{tag}", {a: [src], b: [reader]})
        proc = run_cli(cli, "set", "apply", "-f", str(path), "-o", "json", input="y\n")
        assert proc.returncode == 0, proc.stderr
        assert [m["phase"] for m in cli_json(proc)["members"]] == ["succeeded", "succeeded"]
        assert (tmp_path / "v.txt").read_text() == "from u\n"
        status = run_cli(cli, "set", "status", "--set", f"api-cli-{tag}", "-o", "json")
        assert status.returncode == 0 and cli_json(status)["phase"] == "succeeded", status.stderr
        streamed = run_cli(cli, "set", "events", "--set", f"api-cli-{tag}")
        assert streamed.returncode == 0, streamed.stderr
        lines = [json.loads(line) for line in streamed.stdout.splitlines()]
        assert {e["stack"] for e in lines[:-1]} == {f"{a}/prod", f"{b}/prod"}
        assert lines[-1]["type"] == "run_complete"
        sse = _sse(server.url, f"/v1/sets/api-cli-{tag}/runs/latest/events", "ops-token", 2)
        assert sse[0] == ("stream", None)
        assert [seq for _, seq in sse[1:]] == [str(e["seq"]) for e in lines[2:]]
        denied = _sse(server.url, f"/v1/sets/api-cli-{tag}/runs/latest/events", "x", 0)
        assert denied == [("401", None)]
        outside = _set(
            tmp_path, f"api-out-{tag}", {f"s43-x{tag}": [file_resource(tmp_path / "x", "x\n")]}
        )
        denied = run_cli(cli, "set", "apply", "-f", str(outside), "--yes")
        assert denied.returncode == 2, denied.stderr
        assert denied.stderr.strip().splitlines() == [
            f"Error: ops is no role on project s43-x{tag}; a set apply needs operator on "
            "every stack's project"
        ], denied.stderr
        assert not (tmp_path / "x").exists()
        gone = run_cli(cli, "set", "destroy", "-f", str(path), "--yes", "-o", "json")
        assert gone.returncode == 0, gone.stderr
        assert not (tmp_path / "u.txt").exists() and not (tmp_path / "v.txt").exists()
    finally:
        server.stop()
    assert "Traceback" not in server.tail(), server.tail()


async def test_a_set_run_past_its_history_budget_continues_as_new(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """With a history budget of 0 a set run continues as new at every step it can (before
    its apply, at a retry): the chain ends as one run would, its first run id names it."""
    import hashlib

    from temporalio.client import WorkflowExecutionStatus

    from tests.integration.opshelp import DIRECT_ONLY
    from tests.integration.test_api import ApiServer

    env, tag, queue = stack_env, _tag(), stack_env["STACKFLOW_TASK_QUEUE"]
    a, b = f"s43-c{tag}", f"s43-d{tag}"
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory must be\n")
    name = f"s43-can-{tag}"
    handle = await temporal_client.start_workflow(
        "SetWorkflow",
        {
            "name": name,
            "history_budget": 0,
            "on_failure": "pause",
            "members": [
                {"project": a, "spec": {"resources": [file_resource(blocker / "a", "a\n")]}},
                {"project": b, "spec": {"resources": [file_resource(tmp_path / "b", "b\n")]}},
            ],
        },
        id=set_workflow_id(name),
        task_queue=queue,
        result_type=SetView,
    )
    first = handle.first_execution_run_id or handle.result_run_id
    assert first is not None

    async def phase(wanted: str) -> SetView | None:
        latest = temporal_client.get_workflow_handle(set_workflow_id(name))
        view = await latest.query("status", result_type=SetView)
        return view if view.phase == wanted else None

    await poll(lambda: phase("awaitingApproval"), timeout=120, what="the set's approval")
    await handle.execute_update("approve", {"by": "alice"})  # the preview's run approves
    paused = await poll(lambda: phase("awaitingDecision"), timeout=120, what="the pause")
    assert [m.phase for m in paused.members] == ["failed", "succeeded"]
    blocker.unlink()
    retried = run_cli(env, "set", "retry", "--set", name)
    assert retried.returncode == 0, retried.stderr
    view = await handle.result()  # follows the runs it continued as
    assert view.phase == "succeeded", view.error
    assert [m.phase for m in view.members] == ["succeeded", "succeeded"]
    assert (blocker / "a").read_text() == "a\n"
    chain, run = [], first
    while True:  # preview + approval | apply + pause | retry
        described = await temporal_client.get_workflow_handle(
            set_workflow_id(name), run_id=run
        ).describe()
        chain.append(described.status)
        if described.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            break
        history = await temporal_client.get_workflow_handle(
            set_workflow_id(name), run_id=run
        ).fetch_history()
        run = history.events[
            -1
        ].workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    assert chain == [WorkflowExecutionStatus.CONTINUED_AS_NEW] * 2 + [
        WorkflowExecutionStatus.COMPLETED
    ]
    backend = releases(env)
    try:  # one apply each (a: failed, then the retry), each naming the set run by its first id
        made = {p: backend.list(StackRef(p, "default")) for p in (a, b)}
    finally:
        backend.close()
    assert [r.phase for r in made[a]] == ["failed", "succeeded"] and len(made[b]) == 1
    assert {r.set_run for rs in made.values() for r in rs} == {f"{name}/{first}"}
    # the API reads the chain by its first run id; the set's one stream spans it
    tokens = tmp_path / "tokens.json"
    digest = hashlib.sha256(b"s43-token").hexdigest()
    tokens.write_text(json.dumps([{"name": "ops", "sha256": digest, "roles": {"s43-*": "viewer"}}]))
    server = ApiServer({**env, "STACKFLOW_API_TOKENS": str(tokens)}, tmp_path / "api.log")
    server.start()
    try:
        import httpx

        auth = {"Authorization": "Bearer s43-token"}
        got = httpx.get(f"{server.url}/v1/sets/{name}/runs/{first}", headers=auth, timeout=30)
        assert got.status_code == 200 and got.json()["phase"] == "succeeded", got.text
        cli = {k: v for k, v in env.items() if k not in DIRECT_ONLY}
        cli.update(STACKFLOW_API_URL=server.url, STACKFLOW_API_TOKEN="s43-token")
        streamed = run_cli(cli, "set", "events", "--set", name)
        assert streamed.returncode == 0, streamed.stderr
        lines = [json.loads(line) for line in streamed.stdout.splitlines()]
        ends = sorted(e["stack"] for e in lines if e["type"] == "stack_complete")
        assert ends == sorted([f"{a}/default"] * 3 + [f"{b}/default"] * 2), ends
        assert lines[-1]["type"] == "run_complete" and lines[-1]["status"] == "succeeded"
        sse = _sse(server.url, f"/v1/sets/{name}/runs/{first}/events", "s43-token", 0)
        assert [seq for _, seq in sse[1:]] == [str(e["seq"]) for e in lines]
    finally:
        server.stop()
