"""Smoke tests: each real service answers the client stackflow uses for it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import redis
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from python_terraform import IsFlagged, Terraform
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.smoke_workflow import SmokeWorkflow, shout


async def test_trivial_workflow_runs_on_the_dev_server(temporal_client: Client) -> None:
    queue = f"smoke-{uuid.uuid4().hex[:8]}"
    async with Worker(
        temporal_client, task_queue=queue, workflows=[SmokeWorkflow], activities=[shout]
    ):
        result = await temporal_client.execute_workflow(
            SmokeWorkflow.run, "stackflow", id=f"smoke-{uuid.uuid4()}", task_queue=queue
        )
    assert result == "STACKFLOW"


def test_redis_set_get(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    key = f"smoke:{uuid.uuid4()}"
    r.set(key, "value", ex=30)
    assert r.get(key) == b"value"
    r.delete(key)
    assert r.get(key) is None


def test_configmap_create_get_delete(kubeconfig: str) -> None:
    api = k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=kubeconfig))
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"greeting": "hello"})
    api.create_namespaced_config_map("default", body)
    got = api.read_namespaced_config_map(name, "default")
    assert got.data == {"greeting": "hello"}
    assert got.metadata.uid
    api.delete_namespaced_config_map(name, "default")
    names = [cm.metadata.name for cm in api.list_namespaced_config_map("default").items]
    assert name not in names


def test_terraform_data_init_apply_destroy(tf_bin: str, tmp_path: Path) -> None:
    workdir = tmp_path / "tf"
    workdir.mkdir()
    config = {
        "resource": {"terraform_data": {"smoke": {"input": {"greeting": "hello"}}}},
        "output": {"greeting": {"value": "${terraform_data.smoke.output.greeting}"}},
    }
    (workdir / "main.tf.json").write_text(json.dumps(config))
    tf = Terraform(working_dir=str(workdir), terraform_bin_path=tf_bin)
    # python-terraform's own init/apply/destroy pass flags today's CLI removed, so the
    # generic cmd is used with explicit options.
    code, out, err = tf.cmd("init", input=False, no_color=IsFlagged)
    assert code == 0, err
    code, out, err = tf.cmd("apply", auto_approve=IsFlagged, input=False, no_color=IsFlagged)
    assert code == 0, err
    code, out, err = tf.cmd("output", json=IsFlagged)
    assert code == 0, err
    assert json.loads(out)["greeting"]["value"] == "hello"
    state = json.loads((workdir / "terraform.tfstate").read_text())
    assert [r["type"] for r in state["resources"]] == ["terraform_data"]
    code, out, err = tf.cmd("destroy", auto_approve=IsFlagged, input=False, no_color=IsFlagged)
    assert code == 0, err
    state = json.loads((workdir / "terraform.tfstate").read_text())
    assert state["resources"] == []
