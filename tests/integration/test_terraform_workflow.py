"""Terraform resources through the real worker and CLI: mixed stacks and concurrency."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.runtimes.terraform import STATE_KEY
from stackflow.state.backend import open_backend
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import file_resource, payload_json_async

MIRROR = Path.home() / ".cache" / "stackflow" / "terraform" / "mirror"
RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"
BUILTIN = "terraform.io/builtin/terraform"


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr}"
    return proc


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(_ok(proc).stdout)


def _spec(path: Path, resources: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"resources": resources}, sort_keys=False))
    return path


def _actions(preview: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["action"] for c in preview["changes"]}


def _recorded(env: dict[str, str], project: str, rid: str) -> dict[str, Any]:
    store = open_backend(env["STACKFLOW_STATE_URL"])
    release = store.list(StackRef(project, "default"), with_state=True)[-1]
    return next(r.attributes for r in release.state.resources if r.id == rid)


@pytest.fixture
def fresh_plugin_cache(tmp_path: Path, stack_env: dict[str, str]) -> dict[str, str]:
    """The worker gets its own, empty plugin cache (same offline mirror): inits race for real."""
    cache = tmp_path / "plugin-cache"
    cache.mkdir()
    rc = tmp_path / "tofurc"
    rc.write_text(
        f'plugin_cache_dir = "{cache}"\n'
        "disable_checkpoint = true\n"
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path = "{MIRROR}"\n    include = ["*/*/*"]\n  }}\n'
        '  direct { exclude = ["*/*/*"] }\n'
        "}\n"
    )
    stack_env["TF_CLI_CONFIG_FILE"] = str(rc)
    return stack_env


def test_mixed_stack_applies_in_dependency_order(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, kubeconfig: str
) -> None:
    env = stack_env
    project = f"tf{uuid.uuid4().hex[:8]}"
    secret_name = f"db-{uuid.uuid4().hex[:6]}"
    pw_id = "hashicorp:random:random_password:pw"
    td_id = "builtin:terraform:terraform_data:greeting"
    secret_id = f"v1:Secret:default:{secret_name}"
    motd = tmp_path / "site" / "motd"
    file_id = f"onprem:File:{motd}"
    resources = [
        {
            "id": secret_id,
            "type": "Kubernetes",
            "attributes": {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": "default"},
                "type": "Opaque",
                "stringData": {"password": f"$kusion_path.{pw_id}.result"},
            },
        },
        {
            "id": pw_id,
            "type": "Terraform",
            "attributes": {"length": 24, "special": False},
            "extensions": {"provider": RANDOM, "resourceType": "random_password"},
        },
        {
            "id": file_id,
            "type": "OnPrem",
            "attributes": {
                "kind": "File",
                "path": str(motd),
                "mode": "0644",
                "content": f"$kusion_path.{td_id}.output.text",
            },
        },
        {
            "id": td_id,
            "type": "Terraform",
            "attributes": {"input": {"text": "hello from terraform_data"}},
            "extensions": {"provider": BUILTIN},
        },
    ]
    spec = _spec(tmp_path / "spec.yaml", resources)
    common = ("--project", project, "--output", "json")

    first = _json(run_cli(env, "preview", "-f", str(spec), *common))
    assert set(_actions(first).values()) == {"Create"}
    pw_change = next(c for c in first["changes"] if c["id"] == pw_id)
    assert {"path": "result", "old": None, "new": "(sensitive value)"} in pw_change["diff"]

    applied = _json(run_cli(env, "apply", "-f", str(spec), "--yes", *common))
    assert applied["phase"] == "succeeded", applied
    order = [r["id"] for r in applied["results"]]
    assert order.index(pw_id) < order.index(secret_id)
    assert order.index(td_id) < order.index(file_id)

    password = _recorded(env, project, pw_id)["result"]
    assert len(password) == 24
    k8s_config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    core = k8s.CoreV1Api()
    secret = core.read_namespaced_secret(secret_name, "default")
    assert secret.data is not None
    assert base64.b64decode(secret.data["password"]).decode() == password
    assert motd.read_text() == "hello from terraform_data"
    assert STATE_KEY in _recorded(env, project, td_id)

    again = _json(run_cli(env, "preview", "-f", str(spec), *common))
    # References resolve from the recorded state: nothing shows as a change.
    assert set(_actions(again).values()) == {"UnChanged"}, again
    assert password not in json.dumps(again)
    assert all(STATE_KEY not in json.dumps(c["diff"]) for c in again["changes"])

    destroyed = _json(run_cli(env, "destroy", "--yes", *common))
    assert destroyed["phase"] == "succeeded"
    assert not motd.exists()
    with pytest.raises(k8s.ApiException) as gone:
        core.read_namespaced_secret(secret_name, "default")
    assert gone.value.status == 404


def test_twenty_independent_resources_apply_concurrently(
    tmp_path: Path, fresh_plugin_cache: dict[str, str], worker_process: WorkerProcess
) -> None:
    env = fresh_plugin_cache
    project = f"tf{uuid.uuid4().hex[:8]}"
    resources: list[dict[str, Any]] = []
    for i in range(10):
        resources.append(
            {
                "id": f"hashicorp:random:random_password:p{i}",
                "type": "Terraform",
                "attributes": {"length": 10 + i},
                "extensions": {"provider": RANDOM, "resourceType": "random_password"},
            }
        )
        resources.append(
            {
                "id": f"builtin:terraform:terraform_data:d{i}",
                "type": "Terraform",
                "attributes": {"input": {"n": i}},
                "extensions": {"provider": BUILTIN},
            }
        )
    spec = _spec(tmp_path / "spec.yaml", resources)
    common = ("--project", project, "--output", "json")

    started = time.monotonic()
    applied = _json(
        run_cli(env, "apply", "-f", str(spec), "--yes", "--max-concurrency", "10", *common)
    )
    elapsed = time.monotonic() - started
    assert applied["phase"] == "succeeded", applied
    assert [r["status"] for r in applied["results"]] == ["succeeded"] * 20
    for i in range(10):
        assert len(_recorded(env, project, f"hashicorp:random:random_password:p{i}")["result"]) == (
            10 + i
        )
    log = worker_process.log.read_text()
    assert "state lock" not in log and "text file busy" not in log
    print(f"20 resources applied in {elapsed:.1f}s (max concurrency 10, cold plugin cache)")

    again = _json(run_cli(env, "preview", "-f", str(spec), *common))
    assert set(_actions(again).values()) == {"UnChanged"}
    destroyed = _json(run_cli(env, "destroy", "--yes", "--max-concurrency", "10", *common))
    assert destroyed["phase"] == "succeeded"
    assert len(destroyed["results"]) == 20


async def _groups(client: Client, workflow_id: str) -> list[list[str]]:
    """The node ids of each ``run_group`` activity of the workflow's latest run."""
    groups = []
    handle = client.get_workflow_handle(workflow_id)
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "run_group":
                group = await payload_json_async(attrs.input.payloads[0])
                groups.append([rid for rid, _ in group["nodes"]])
    return groups


async def test_ready_terraform_nodes_go_to_one_tofu_command_whatever_the_concurrency(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """With ``--max-concurrency 2`` a group's share is one call: groups of cheap runtimes take
    8 nodes (GROUP_ROUNDS rounds), a Terraform group every ready node (one tofu command),
    and no group mixes runtimes."""
    project = f"tfw{uuid.uuid4().hex[:8]}"
    data = [
        {
            "id": f"builtin:terraform:terraform_data:d{i:02d}",
            "type": "Terraform",
            "attributes": {"input": {"n": i}},
            "extensions": {"provider": BUILTIN},
        }
        for i in range(12)
    ]
    root = tmp_path / "files"
    files = [file_resource(root / f"f{i:02d}", f"{i}\n") for i in range(10)]
    spec = _spec(tmp_path / "spec.yaml", [*data, *files])
    common = ("--project", project, "--output", "json", "--max-concurrency", "2")
    applied = _json(run_cli(stack_env, "apply", "-f", str(spec), "--yes", *common))
    assert applied["phase"] == "succeeded", applied
    assert [r["status"] for r in applied["results"]] == ["succeeded"] * 22
    assert sorted(p.name for p in root.iterdir()) == [f"f{i:02d}" for i in range(10)]
    workflow_id = f"stackflow/{project}/default"
    groups = await _groups(temporal_client, workflow_id)
    terraform = [g for g in groups if g[0].startswith("builtin:terraform:")]
    onprem = [g for g in groups if g[0].startswith("onprem:")]
    assert terraform == [[d["id"] for d in data]], groups
    # whole-onprem-groups: 32 per call of its share (1): the ten files in one group
    assert sorted(len(g) for g in onprem) == [10], groups
    assert all(len({rid.split(":")[0] for rid in g}) == 1 for g in groups), groups

    destroyed = _json(run_cli(stack_env, "destroy", "--yes", *common))
    assert destroyed["phase"] == "succeeded", destroyed
    gone = await _groups(temporal_client, workflow_id)
    tf_gone = [sorted(g) for g in gone if g[0].startswith("builtin:terraform:")]
    assert tf_gone == [sorted(d["id"] for d in data)], gone
    assert list(root.iterdir()) == []
    # the destroy's preview refreshed the twelve once; its delete destroyed from that state
    refreshed = f"{project}/default release 2: destroying from the state its preview refreshed"
    assert worker_process.log.read_text().count(refreshed) == 1
    assert _kept_plans(stack_env, project) == []  # taken, and the rest gone with the release


def _kept_plans(env: dict[str, str], project: str) -> list[int]:
    """The releases the stack's kept Terraform plans are for."""
    from stackflow.state.schema import terraform_plans

    store = open_backend(env["STACKFLOW_STATE_URL"])
    try:
        with store.engine.begin() as conn:
            rows = conn.execute(
                terraform_plans.select().where(terraform_plans.c.project == project)
            ).fetchall()
    finally:
        store.close()
    return [row.revision for row in rows]


async def test_an_approved_apply_applies_the_plan_its_preview_showed(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    """Through the worker: the preview of a run waiting for approval has kept its Terraform
    plan for the run's release; the approved apply takes it (nothing is left kept), and the
    resources hold the previewed values."""
    from stackflow.temporal.operation import ApprovalInput, OperationInput
    from tests.integration.opshelp import start_run, wait_phase

    project = f"tfp{uuid.uuid4().hex[:8]}"
    spec = {
        "resources": [
            {
                "id": f"builtin:terraform:terraform_data:p{i}",
                "type": "Terraform",
                "attributes": {"input": {"n": i}},
                "extensions": {"provider": BUILTIN},
            }
            for i in range(6)
        ]
    }
    handle = await start_run(temporal_client, stack_env, OperationInput(project=project, spec=spec))
    await wait_phase(handle, "awaitingApproval")
    assert _kept_plans(stack_env, project) == [1]  # release 1's preview kept its plan
    await handle.execute_update("approve", ApprovalInput(by="alice"))
    result = await handle.result()
    assert result.phase == "succeeded", result
    applied = f"{project}/default release 1: applying the plan its preview made"
    assert worker_process.log.read_text().count(applied) == 1  # its apply took it
    assert _kept_plans(stack_env, project) == []
    for i in range(6):
        recorded = _recorded(stack_env, project, f"builtin:terraform:terraform_data:p{i}")
        assert recorded["output"] == {"n": i}
