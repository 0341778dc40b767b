"""Kubernetes stacks end to end: the real CLI and worker, Temporal, and the real control plane.

kube-scheduler and kwok run beside kube-apiserver, so Deployments really roll out and Jobs
complete (``--watch``). Every test has its own project, namespace and CRD group.
"""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from stackflow.workflows.constants import PHASE_KEY
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.kubehelp import (
    config_map,
    crd,
    delete_quietly,
    deployment,
    kusion_id,
    namespace,
    resource,
    secret,
    service,
    services,
    suffix,
    widget,
)
from tests.integration.opshelp import cli_json, new_project, poll, write_spec

Obj = dict[str, Any]


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def _actions(preview: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["action"] for c in preview["changes"]}


def _gone(read: Any) -> bool:
    try:
        read()
    except k8s.ApiException as exc:
        return bool(exc.status == 404)
    return False


async def test_kubernetes_stack_preview_apply_drift_delete_destroy(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
) -> None:
    env, project, ns = stack_env, new_project(), f"sf-{suffix()}"
    group = f"g{suffix()}.stackflow.test"
    password = f"s3cret-{suffix()}"
    common = ("--project", project, "--output", "json")
    ns_obj = namespace(ns)
    ns_id = kusion_id(ns_obj)
    definition = crd(group)
    res = {
        "ns": resource(ns_obj),
        "cm": resource(config_map(ns, "settings", {"mode": "fast"}), deps=[ns_id]),
        "secret": resource(secret(ns, "creds", {"password": password}), deps=[ns_id]),
        "deploy": resource(deployment(ns, "web"), deps=[ns_id]),
        "svc": resource(service(ns, "web"), deps=[ns_id]),
        "crd": resource(definition),
        # a custom kind the collector has not resynced yet: see the runtime's delete notes
        "widget": resource(
            widget(group, ns, "w1", "blue"),
            deps=[ns_id, kusion_id(definition)],
            deletionPropagation="Background",
        ),
    }
    ids = {k: r["id"] for k, r in res.items()}
    spec = write_spec(tmp_path / "spec.yaml", list(res.values()))
    secret_texts = (password, base64.b64encode(password.encode()).decode())
    try:
        # preview of a new stack: all Create (the namespace and CRD do not exist yet)
        started = time.monotonic()
        first = cli_json(_ok(run_cli(env, "preview", "-f", str(spec), *common)))
        preview_seconds = time.monotonic() - started
        assert set(_actions(first).values()) == {"Create"} and len(first["changes"]) == 7
        table = _ok(run_cli(env, "preview", "-f", str(spec), "--project", project))
        for text in secret_texts:
            assert text not in table.stdout + table.stderr
            assert text not in str(first)

        # apply, waiting for readiness: the Deployment rolls out on kwok's node
        started = time.monotonic()
        applied = cli_json(_ok(run_cli(env, "apply", "-f", str(spec), "--yes", "--watch", *common)))
        apply_seconds = time.monotonic() - started
        assert applied["phase"] == "succeeded"
        assert sorted(r["status"] for r in applied["results"]) == ["succeeded"] * 7
        status = k8s.AppsV1Api(api).read_namespaced_deployment_status("web", ns).status
        assert status is not None and status.available_replicas == 1
        print(f"\nCLI: preview of 7 {preview_seconds:.2f}s, apply --watch {apply_seconds:.2f}s")

        # nothing changed: all UnChanged, secret still not shown
        again = cli_json(_ok(run_cli(env, "preview", "-f", str(spec), *common)))
        assert set(_actions(again).values()) == {"UnChanged"}, again
        for text in secret_texts:
            assert text not in str(again)

        # one field: exactly one Update, with that path
        res["cm"] = resource(config_map(ns, "settings", {"mode": "safe"}), deps=[ns_id])
        del res["svc"]  # and the Service leaves the spec
        spec2 = write_spec(tmp_path / "spec2.yaml", list(res.values()))
        changed = cli_json(_ok(run_cli(env, "preview", "-f", str(spec2), *common)))
        actions = _actions(changed)
        assert actions.pop(ids["cm"]) == "Update" and actions.pop(ids["svc"]) == "Delete"
        assert set(actions.values()) == {"UnChanged"}
        [cm_change] = [c for c in changed["changes"] if c["id"] == ids["cm"]]
        assert [(d["path"], d["old"], d["new"]) for d in cm_change["diff"]] == [
            ("data.mode", "fast", "safe")
        ]
        _ok(run_cli(env, "apply", "-f", str(spec2), "--yes", *common))
        core = k8s.CoreV1Api(api)
        assert core.read_namespaced_config_map("settings", ns).data == {"mode": "safe"}
        assert _gone(lambda: core.read_namespaced_service("web", ns))

        # drift: scaled behind stackflow's back by another field manager
        apps = k8s.AppsV1Api(api)
        apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 3}}, field_manager="ops")
        drifted = cli_json(_ok(run_cli(env, "preview", "-f", str(spec2), *common)))
        [dep_change] = [c for c in drifted["changes"] if c["id"] == ids["deploy"]]
        assert dep_change["action"] == "Update" and dep_change["drift"] is True
        assert [(d["path"], d["old"], d["new"]) for d in dep_change["diff"]] == [
            ("spec.replicas", 3, 1)
        ]
        repaired = cli_json(_ok(run_cli(env, "apply", "-f", str(spec2), "--yes", *common)))
        assert [r["id"] for r in repaired["results"]] == [ids["deploy"]]
        deployed = apps.read_namespaced_deployment("web", ns).spec
        assert deployed is not None and deployed.replicas == 1

        # destroy removes everything, in reverse dependency order
        destroyed = cli_json(_ok(run_cli(env, "destroy", "--yes", *common)))
        assert destroyed["phase"] == "succeeded" and len(destroyed["results"]) == 6
        assert _gone(lambda: core.read_namespace(ns))
        ext = k8s.ApiextensionsV1Api(api)
        assert _gone(lambda: ext.read_custom_resource_definition(definition["metadata"]["name"]))
    finally:
        delete_quietly(api, namespaces=[ns], crds=[definition["metadata"]["name"]])


async def test_ownership_adoption_and_invalid_manifest_through_the_cli(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
) -> None:
    env, ns = stack_env, f"sf-{suffix()}"
    owner, other = new_project(), new_project()
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    try:
        shared = write_spec(
            tmp_path / "shared.yaml", [resource(config_map(ns, "shared", {"a": "1"}))]
        )
        _ok(run_cli(env, "apply", "-f", str(shared), "--yes", "--project", owner, "-o", "json"))
        # another stack may neither preview-take nor apply it
        clash = run_cli(env, "apply", "-f", str(shared), "--yes", "--project", other, "-o", "json")
        assert clash.returncode != 0
        assert f"belongs to stackflow stack {owner}/default" in clash.stdout + clash.stderr

        # an object made by hand is adopted only when asked to
        core.create_namespaced_config_map(
            ns, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="handmade"), data={"b": "2"})
        )
        handmade = config_map(ns, "handmade", {"b": "2"})
        plain = write_spec(tmp_path / "plain.yaml", [resource(handmade)])
        refused = run_cli(env, "apply", "-f", str(plain), "--yes", "--project", other)
        assert refused.returncode != 0
        assert "not managed by stackflow" in refused.stdout + refused.stderr
        adopt = write_spec(tmp_path / "adopt.yaml", [resource(handmade, adopt=True)])
        _ok(run_cli(env, "apply", "-f", str(adopt), "--yes", "--project", other, "-o", "json"))
        metadata = core.read_namespaced_config_map("handmade", ns).metadata
        assert metadata is not None and metadata.annotations is not None
        assert metadata.annotations["stackflow.io/project"] == other

        # an invalid manifest fails at preview, with the API server's own words
        bad = deployment(ns, "bad")
        bad["spec"]["selector"]["matchLabels"] = {"app": "nope"}
        bad_spec = write_spec(tmp_path / "bad.yaml", [resource(bad)])
        failed = run_cli(env, "preview", "-f", str(bad_spec), "--project", other)
        assert failed.returncode != 0
        assert "`selector` does not match template `labels`" in failed.stdout + failed.stderr
    finally:
        delete_quietly(api, namespaces=[ns])


@pytest.mark.serial
async def test_api_server_outage_is_retried_and_the_apply_resumes(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
    api: k8s.ApiClient,
) -> None:
    env, project, ns = stack_env, new_project(), f"sf-{suffix()}"
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    spec = write_spec(tmp_path / "spec.yaml", [resource(config_map(ns, "later", {"k": "v"}))])
    proc: subprocess.Popen[str] | None = None
    try:
        services("down", "kube-apiserver")
        proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "stackflow"), "apply", "-f", str(spec), "--yes",
             "--project", project, "--output", "json"],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        handle = temporal_client.get_workflow_handle(f"stackflow/{project}/default")

        async def retrying() -> str | None:
            desc = await handle.describe()
            for pending in desc.raw_description.pending_activities:
                failure = pending.last_failure.message
                if pending.attempt >= 2 and "unreachable" in failure:
                    return failure
            return None

        # the workflow may not exist yet: poll() retries until the deadline
        failure = await poll(retrying, timeout=60, what="an activity retrying Unavailable")
        assert proc.poll() is None  # the apply is still running, waiting for the cluster
        # visibility says what it waits in (a small run's preview falls back to the activity)
        attributes = (await handle.describe()).typed_search_attributes
        assert attributes.get(PHASE_KEY) == "previewing"
    finally:
        services("up", "kube-apiserver")
    assert proc is not None
    try:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
        assert cli_json(subprocess.CompletedProcess([], 0, out, err))["phase"] == "succeeded"
        assert core.read_namespaced_config_map("later", ns).data == {"k": "v"}
        print(f"\nretried while the API server was down: {failure}")
    finally:
        if proc.poll() is None:
            proc.kill()
        delete_quietly(api, namespaces=[ns])
        # restarts whichever companion did not survive the outage (a no-op when healthy)
        services("up", "kube-controller-manager", "kube-scheduler", "kwok")
