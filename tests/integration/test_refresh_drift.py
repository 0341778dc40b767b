"""Refresh and drift detection on the dev services: a file or a ConfigMap changed behind
stackflow's back is reported by `drift check` (exit 4), recorded by `refresh` without being
touched, and brought back by a scheduled check with --repair; the schedule is a real
Temporal Schedule (`temporal schedule list`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.codec import data_converter
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.kubehelp import (
    config_map,
    delete_quietly,
    kusion_id,
    namespace,
    resource,
    suffix,
)
from tests.integration.opshelp import (
    all_releases,
    cli_json,
    dir_resource,
    file_resource,
    new_project,
    releases,
    write_spec,
)
from tests.integration.opshelp import (
    expect_exit as _ok,
)

DRIFT_EXIT = 4


def _apply(env: dict[str, str], spec: Path, project: str) -> None:
    result = cli_json(
        _ok(run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "-o", "json"))
    )
    assert result["phase"] == "succeeded", result


def _schedules(env: dict[str, str]) -> str:
    """What `temporal schedule list` prints."""
    return subprocess.run(
        ["temporal", "schedule", "list", "--address", env["TEMPORAL_ADDRESS"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _drift_count(env: dict[str, str], project: str) -> int:
    backend = releases(env)
    try:
        return len(backend.drift_reports(StackRef(project, "default"), limit=1000))
    finally:
        backend.close()


async def _drifted_stacks(project: str) -> list[bool]:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], data_converter=data_converter())
    found = []
    query = f"WorkflowType = 'DriftWorkflow' AND StackflowProject = '{project}'"
    async for wf in client.list_workflows(query + " AND StackflowDrift = true"):
        found.append(wf.status is not None)
    return found


def test_onprem_drift_check_refresh_and_scheduled_repair(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    root = tmp_path / "site"
    d = dir_resource(root)
    conf = file_resource(root / "app.conf", "port = 80\n", deps=[d["id"]])
    spec = write_spec(tmp_path / "spec.yaml", [d, conf])
    _apply(env, spec, project)

    clean = cli_json(_ok(run_cli(env, "drift", "check", "-p", project, "-o", "json")))
    assert clean["drifted"] is False and clean["summary"]["checked"] == 2

    (root / "app.conf").write_text("port = 8080\n")  # behind stackflow's back
    found = _ok(run_cli(env, "drift", "check", "-p", project, "-o", "json"), DRIFT_EXIT)
    report = cli_json(found)
    assert report["drifted"] is True and report["summary"]["drifted"] == 1
    assert report["summary"]["ids"] == [conf["id"]]
    [row] = report["drifted_resources"]
    assert row["id"] == conf["id"]
    assert {"path": "content", "old": "port = 8080\n", "new": "port = 80\n"} in row["diff"]
    assert f"drift found in 1 resource(s) of {project}/default" in found.stderr
    # no release, no lock: a check only reads
    assert [r.revision for r in all_releases(env, project)] == [1]
    status = cli_json(_ok(run_cli(env, "drift", "status", "-p", project, "-o", "json")))
    assert status["drifted"] is True and status["drifted_resources"][0]["id"] == conf["id"]
    assert asyncio.run(_drifted_stacks(project)), "StackflowDrift = true lists the check"

    # refresh records the change without touching the file
    refreshed = cli_json(_ok(run_cli(env, "refresh", "-p", project, "--yes", "-o", "json")))
    assert refreshed["phase"] == "succeeded" and refreshed["operation"] == "refresh"
    assert refreshed["changes"]["summary"]["Update"] == 1
    [line] = [c for c in refreshed["changes"]["changes"] if c["action"] == "Update"]
    assert line["id"] == conf["id"] and line["drift"] is True
    assert (root / "app.conf").read_text() == "port = 8080\n"
    latest = all_releases(env, project)[-1]
    assert latest.revision == 2 and latest.operation == "refresh"
    recorded = {r.id: r.attributes for r in latest.state.resources}
    assert recorded[conf["id"]]["content"] == "port = 8080\n"
    # nothing changed since: a second refresh records nothing new
    again = cli_json(_ok(run_cli(env, "refresh", "-p", project, "--yes", "-o", "json")))
    assert again["changes"]["summary"]["Update"] == 0

    # the spec still says port 80: drift (recorded = live now, desired differs: pending)
    pending = cli_json(_ok(run_cli(env, "drift", "check", "-p", project, "-o", "json")))
    assert pending["drifted"] is False and pending["summary"]["pending"] == 1

    # a scheduled check with --repair: the file is changed again and comes back by itself
    _apply(env, spec, project)
    (root / "app.conf").write_text("port = 9090\n")
    before = _drift_count(env, project)
    _ok(run_cli(env, "drift", "schedule", "-p", project, "--every", "10s", "--repair", "--yes"))
    try:
        listed = _schedules(env)
        assert f"stackflow-drift/{project}/default" in listed
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (root / "app.conf").read_text() == "port = 80\n":
                break
            time.sleep(0.5)
        assert (root / "app.conf").read_text() == "port = 80\n", "the repair apply ran"
        assert _drift_count(env, project) > before
        backend = releases(env)
        try:
            last = backend.drift_reports(StackRef(project, "default"), limit=1000)
        finally:
            backend.close()
        assert any(r.drifted and r.repair_workflow_id for r in last)
    finally:
        _ok(run_cli(env, "drift", "unschedule", "-p", project))
    listed = _schedules(env)
    assert f"stackflow-drift/{project}/default" not in listed
    gone = _ok(run_cli(env, "drift", "unschedule", "-p", project), 1)
    assert "has no drift schedule" in gone.stderr
    bad = _ok(run_cli(env, "drift", "schedule", "-p", project, "--every", "soon"), 2)
    assert "--every soon" in bad.stderr


def test_kubernetes_configmap_drift_is_reported_and_refreshed(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, api: k8s.ApiClient
) -> None:
    env, project, ns = stack_env, new_project(), f"sf-{suffix()}"
    ns_obj = namespace(ns)
    cm = config_map(ns, "settings", {"mode": "fast"})
    spec = write_spec(
        tmp_path / "spec.yaml", [resource(ns_obj), resource(cm, deps=[kusion_id(ns_obj)])]
    )
    core = k8s.CoreV1Api(api)
    try:
        _apply(env, spec, project)
        clean = cli_json(_ok(run_cli(env, "drift", "check", "-p", project, "-o", "json")))
        assert clean["drifted"] is False and clean["summary"]["checked"] == 2

        body: dict[str, Any] = {"data": {"mode": "slow"}}
        core.patch_namespaced_config_map("settings", ns, body)  # behind stackflow's back
        report = cli_json(
            _ok(run_cli(env, "drift", "check", "-p", project, "-o", "json"), DRIFT_EXIT)
        )
        assert report["summary"]["ids"] == [f"v1:ConfigMap:{ns}:settings"]
        [row] = report["drifted_resources"]
        assert {"path": "data.mode", "old": "slow", "new": "fast"} in row["diff"]

        refreshed = cli_json(_ok(run_cli(env, "refresh", "-p", project, "--yes", "-o", "json")))
        assert refreshed["changes"]["summary"]["Update"] == 1
        assert core.read_namespaced_config_map("settings", ns).data == {"mode": "slow"}
        latest = all_releases(env, project)[-1]
        recorded = {r.id: r.attributes for r in latest.state.resources}
        assert recorded[f"v1:ConfigMap:{ns}:settings"]["data"] == {"mode": "slow"}
    finally:
        delete_quietly(api, namespaces=[ns])
