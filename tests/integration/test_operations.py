"""Operation workflows end to end: the real CLI, a real worker process, the dev server.

Resources are OnPrem files and directories under ``tmp_path``; every test has its own
STACKFLOW_HOME, task queue and project (so its workflow ids never meet another test's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.engine.budget import BUDGET, size_of
from stackflow.temporal.operation import OperationInput, OperationResult, workflow_id_for
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    assert_histories_replay,
    cli_json,
    dir_resource,
    file_resource,
    new_project,
    write_spec,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def state_kind(request: pytest.FixtureRequest) -> str:
    """These tests pass on both state backends."""
    return str(request.param)


def _actions(preview: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["action"] for c in preview["changes"]}


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


async def test_preview_apply_update_destroy_through_the_cli(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env = stack_env
    project = new_project()
    root = tmp_path / "site"
    d = dir_resource(root)
    a = file_resource(root / "a.conf", "a = 1\n", deps=[d["id"]])
    b = file_resource(root / "b.conf", "b = 1\n", deps=[d["id"]])
    spec = write_spec(tmp_path / "spec.yaml", [d, a, b])
    common = ("--project", project, "--output", "json")

    # preview of a new stack: all Create, nothing touched
    first = cli_json(_ok(run_cli(env, "preview", "-f", str(spec), *common)))
    assert _actions(first) == {d["id"]: "Create", a["id"]: "Create", b["id"]: "Create"}
    assert first["summary"]["Create"] == 3
    assert not root.exists()

    # apply
    applied = cli_json(_ok(run_cli(env, "apply", "-f", str(spec), "--yes", *common)))
    assert applied["phase"] == "succeeded" and applied["revision"] == 1
    assert sorted(r["status"] for r in applied["results"]) == ["succeeded"] * 3
    assert (root / "a.conf").read_text() == "a = 1\n"
    assert (root / "b.conf").read_text() == "b = 1\n"
    assert sorted(r["id"] for r in applied["release"]["state"]["resources"]) == sorted(
        [d["id"], a["id"], b["id"]]
    )

    # preview again: nothing to do
    again = cli_json(_ok(run_cli(env, "preview", "-f", str(spec), *common)))
    assert set(_actions(again).values()) == {"UnChanged"}
    assert again["summary"]["UnChanged"] == 3

    # an apply with nothing to do succeeds and changes nothing
    noop = cli_json(_ok(run_cli(env, "apply", "-f", str(spec), "--yes", *common)))
    assert noop["phase"] == "succeeded" and noop["results"] == []

    # change one resource: exactly one Update, on the content field
    b2 = file_resource(root / "b.conf", "b = 2\n", deps=[d["id"]])
    spec2 = write_spec(tmp_path / "spec2.yaml", [d, a, b2])
    changed = cli_json(_ok(run_cli(env, "preview", "-f", str(spec2), *common)))
    updates = [c for c in changed["changes"] if c["action"] != "UnChanged"]
    assert [(c["id"], c["action"]) for c in updates] == [(b["id"], "Update")]
    assert [f["path"] for f in updates[0]["diff"]] == ["content"]
    assert updates[0]["diff"][0]["old"] == "b = 1\n" and updates[0]["diff"][0]["new"] == "b = 2\n"
    assert (root / "b.conf").read_text() == "b = 1\n"  # preview changes nothing

    updated = cli_json(_ok(run_cli(env, "apply", "-f", str(spec2), "--yes", *common)))
    assert [(r["id"], r["action"], r["status"]) for r in updated["results"]] == [
        (b["id"], "Update", "succeeded")
    ]
    assert (root / "b.conf").read_text() == "b = 2\n"

    # destroy: everything gone, release succeeded with an empty state
    destroyed = cli_json(_ok(run_cli(env, "destroy", "--yes", *common)))
    assert destroyed["phase"] == "succeeded"
    assert sorted(r["action"] for r in destroyed["results"]) == ["Delete"] * 3
    assert not root.exists()
    final = all_releases(env, project)[-1]
    assert final.revision == destroyed["revision"]
    assert final.operation == "destroy" and final.phase == "succeeded"
    assert final.state.resources == []
    assert [r.phase for r in all_releases(env, project)] == ["succeeded"] * len(
        all_releases(env, project)
    )

    # table output still works and exit code 0
    table = _ok(run_cli(env, "preview", "-f", str(spec), "--project", project))
    assert "Create" in table.stdout

    # four previews, three applies and a destroy: every history replays
    assert await assert_histories_replay(temporal_client, project, at_least=8) == 8


async def test_a_failing_node_keeps_partial_state_and_the_fixed_spec_finishes_the_job(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    env = stack_env
    project = new_project()
    root = tmp_path / "site"
    (tmp_path / "taken").mkdir()  # a directory where the spec wants a file: Conflict
    (tmp_path / "plain").write_text("a regular file\n")  # a file where a parent dir must be
    d = dir_resource(root)
    ok_a = file_resource(root / "a.conf", "a\n", deps=[d["id"]])
    independent = file_resource(tmp_path / "independent.txt", "i\n")
    clash = file_resource(tmp_path / "taken", "never\n")
    after_clash = file_resource(root / "after.conf", "after\n", deps=[clash["id"], d["id"]])
    under_file = file_resource(tmp_path / "plain" / "child.txt", "never\n")
    spec = write_spec(tmp_path / "bad.yaml", [d, ok_a, independent, clash, after_clash, under_file])
    common = ("--project", project, "--output", "json")

    failed = cli_json(_ok(run_cli(env, "apply", "-f", str(spec), "--yes", *common), code=2))
    assert failed["phase"] == "failed"
    status = {r["id"]: r["status"] for r in failed["results"]}
    assert status == {
        d["id"]: "succeeded",
        ok_a["id"]: "succeeded",
        independent["id"]: "succeeded",
        clash["id"]: "failed",
        after_clash["id"]: "skipped",
        under_file["id"]: "failed",
    }
    errors = {r["id"]: r["error"] for r in failed["results"]}
    assert "exists as a Directory, not a File" in errors[clash["id"]]
    assert "plain" in errors[under_file["id"]]
    assert f"dependency {clash['id']} did not succeed" in errors[after_clash["id"]]
    assert failed["error"].startswith(clash["id"]) or failed["error"].startswith(under_file["id"])
    [release] = all_releases(env, project)
    assert release.phase == "failed" and release.error
    assert sorted(r.id for r in release.state.resources) == sorted(
        [d["id"], ok_a["id"], independent["id"]]
    )
    assert (root / "a.conf").read_text() == "a\n"
    assert not (root / "after.conf").exists()
    assert (tmp_path / "plain").read_text() == "a regular file\n"

    # fix the spec: the next apply creates only what is missing
    fixed_clash = file_resource(tmp_path / "taken" / "now-a-file.txt", "fixed\n")
    fixed_after = file_resource(root / "after.conf", "after\n", deps=[fixed_clash["id"], d["id"]])
    fixed_under = file_resource(tmp_path / "plain-dir" / "child.txt", "fixed\n")
    spec2 = write_spec(
        tmp_path / "fixed.yaml", [d, ok_a, independent, fixed_clash, fixed_after, fixed_under]
    )
    done = cli_json(_ok(run_cli(env, "apply", "-f", str(spec2), "--yes", *common)))
    assert done["phase"] == "succeeded"
    assert sorted(r["id"] for r in done["results"]) == sorted(
        [fixed_clash["id"], fixed_after["id"], fixed_under["id"]]
    )
    assert {r["action"] for r in done["results"]} == {"Create"}
    latest = all_releases(env, project)[-1]
    assert latest.revision == 2 and latest.phase == "succeeded"
    assert len(latest.state.resources) == 6
    assert len({r.id for r in latest.state.resources}) == 6
    assert (root / "after.conf").read_text() == "after\n"
    assert (tmp_path / "taken" / "now-a-file.txt").read_text() == "fixed\n"
    assert await assert_histories_replay(temporal_client, project, at_least=2) == 2


async def test_the_temporal_cli_starts_an_apply(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """The docs' line (guide/temporal-clients.md, and the README's tour): `temporal workflow start`
    with an inline spec applies it."""
    project = new_project()
    target = tmp_path / "from-cli.txt"
    request = {
        "project": project,
        "workspace": "dev",
        "spec": {"resources": [file_resource(target, "hello from temporal\n")]},
        "auto_approve": True,
    }
    workflow_id = f"stackflow/{project}/dev"
    temporal = shutil.which("temporal", path=stack_env.get("PATH"))
    assert temporal, 'the Temporal CLI is not on PATH: eval "$(scripts/services.sh env)"'
    base = [temporal, "--address", stack_env["TEMPORAL_ADDRESS"]]
    start = [
        "workflow",
        "start",
        "--task-queue",
        stack_env["STACKFLOW_TASK_QUEUE"],
        "--type",
        "ApplyWorkflow",
        "--workflow-id",
        workflow_id,
        "--fail-existing",
        "--id-conflict-policy",
        "Fail",
        "--input",
        json.dumps(request),
    ]
    started = subprocess.run(
        [*base, *start], capture_output=True, text=True, timeout=60, env=stack_env
    )
    assert started.returncode == 0, started.stdout + started.stderr

    # the result is encrypted in history: the temporal CLI reads it through the codec server
    show = [*base, "workflow", "result", "--workflow-id", workflow_id, "--output", "json"]
    codec = stack_env.get("STACKFLOW_CODEC_ENDPOINT")
    if codec:
        show += ["--codec-endpoint", codec]
    result = subprocess.run(show, capture_output=True, text=True, timeout=120, env=stack_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"succeeded"' in result.stdout
    described = subprocess.run(
        [*base, "workflow", "describe", "--workflow-id", workflow_id, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=stack_env,
    )
    assert described.returncode == 0, described.stdout + described.stderr
    info = json.loads(described.stdout)
    assert "COMPLETED" in json.dumps(info.get("workflowExecutionInfo", info)).upper()
    assert target.read_text() == "hello from temporal\n"
    [release] = all_releases(stack_env, project, "dev")
    assert release.phase == "succeeded" and release.workflow_id == workflow_id
    assert release.approval is not None and release.approval.by == "temporal (auto_approve)"

    # the same line again while nothing runs starts a fresh apply (nothing to change)
    again = subprocess.run(
        [*base, *start], capture_output=True, text=True, timeout=60, env=stack_env
    )
    assert again.returncode == 0, again.stdout + again.stderr
    handle = temporal_client.get_workflow_handle(workflow_id)
    second = await handle.result()
    assert second["phase"] == "succeeded" and second["results"] == []
    assert await assert_histories_replay(temporal_client, project, at_least=2) == 2


async def test_runs_past_the_detail_limit_keep_compact_histories(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """650 files in children of 250 (plan by ref, compact preview and results): counts are
    complete, shown lines are capped, and a change past the diffed lines is described."""
    project = new_project()
    root = tmp_path / "many"
    d = dir_resource(root)
    files = [file_resource(root / f"{i:03d}.txt", f"{i}\n", deps=[d["id"]]) for i in range(649)]
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    workflow_id = workflow_id_for(StackRef(project, "default"))

    async def apply(resources: list[dict[str, Any]]) -> OperationResult:
        request = OperationInput(
            project=project, spec={"resources": resources}, auto_approve=True, batch_size=250
        )
        result: OperationResult = await temporal_client.execute_workflow(
            "ApplyWorkflow", request, id=workflow_id, task_queue=queue, result_type=OperationResult
        )
        return result

    first = await apply([d, *files])
    assert first.phase == "succeeded" and first.counts == {"succeeded": 650}
    assert first.truncated and first.results == []
    assert first.changes["summary"]["Create"] == 650 and len(first.changes["changes"]) == 500
    # within the byte budget: the first changes keep their diffs, the rest say they were
    # summarised (the full diffs are in the state backend)
    shown = first.changes["changes"]
    assert all(c["diff"] or c.get("diff_omitted") for c in shown)
    assert shown[0]["diff"] and size_of(first.changes) <= BUDGET
    assert len(list(root.iterdir())) == 649

    files[5] = file_resource(root / "005.txt", "changed\n", deps=[d["id"]])
    files[640] = file_resource(root / "640.txt", "changed\n", deps=[d["id"]])
    second = await apply([d, *files])
    assert second.phase == "succeeded" and second.counts == {"succeeded": 2}
    assert [r.id for r in second.results] == [files[5]["id"], files[640]["id"]]
    shown = second.changes["changes"]
    assert second.truncated and [c["id"] for c in shown] == [files[5]["id"], files[640]["id"]]
    assert shown[0]["diff"][0]["path"] == "content"
    assert shown[1]["diff"] == [] and shown[1]["diff_omitted"] is True
    assert second.changes["summary"] == {"Create": 0, "Update": 2, "Delete": 0, "UnChanged": 648}
    assert (root / "640.txt").read_text() == "changed\n"

    # 2 parents + 3 children
    assert await assert_histories_replay(temporal_client, project, at_least=5) == 5
