"""Stack sets on the dev services with real runtimes: an OnPrem "network", a Terraform
``random_password`` "database" and a Kubernetes "service" whose Secret reads the database's
password through a ``$stack.`` reference; a worker of this tree runs the set and its members."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.json_format import MessageToDict, ParseDict
from kubernetes import client as k8s
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle

from stackflow.core.refs import StackRef
from stackflow.model.release import Operation, Phase
from stackflow.temporal.codec import payload_codec
from stackflow.temporal.stack_set import set_workflow_id
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import all_releases, cli_json, releases

RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"
PW = "hashicorp:random:random_password:pw"


def _run(env: dict[str, str], *args: str, code: int = 0) -> Any:
    proc = run_cli(env, "set", *args, "--output", "json", timeout=600)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return cli_json(proc) if code != 2 else proc


def _members(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{m['project']}/{m['workspace']}": m for m in view["members"]}


class Shop:
    """The three stacks' spec files and the set file, in a directory."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.root = root
        self.net, self.db, self.svc = (f"set{k}{tag}" for k in ("net", "db", "svc"))
        self.secret = f"set-{tag}"
        self.conf = root / "net" / "cidr.conf"
        self.conf_id = f"onprem:File:{self.conf}"
        self.pw_file = root / "svc" / "password"
        self.write(cidr="10.0.0.0/16\n", length=16)
        self.file = root / "stacks.yaml"
        self.file.write_text(
            yaml.safe_dump(
                {
                    "name": f"shop-{tag}",
                    "stacks": [
                        {"project": self.net, "workspace": "prod", "spec": "network.yaml"},
                        {
                            "project": self.db,
                            "workspace": "prod",
                            "spec": "database.yaml",
                            "dependsOn": [f"{self.net}/prod"],
                        },
                        {"project": self.svc, "workspace": "prod", "spec": "service.yaml"},
                    ],
                }
            )
        )

    def write(self, cidr: str, length: Any) -> None:
        self._spec(
            "network.yaml",
            {
                "id": self.conf_id,
                "type": "OnPrem",
                "attributes": {"kind": "File", "path": str(self.conf), "content": cidr},
            },
        )
        self._spec(
            "database.yaml",
            {
                "id": PW,
                "type": "Terraform",
                "attributes": {"length": length, "special": False},
                "extensions": {"provider": RANDOM, "resourceType": "random_password"},
            },
        )
        self._spec(
            "service.yaml",
            {
                "id": f"v1:Secret:default:{self.secret}",
                "type": "Kubernetes",
                "attributes": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": self.secret, "namespace": "default"},
                    "stringData": {
                        "password": f"$stack.{self.db}/prod.{PW}.result",
                        "cidr": f"$stack.{self.net}/prod.{self.conf_id}.content",
                    },
                },
            },
            {  # a plain field taking the password: masked as the stack's secret
                "id": f"onprem:File:{self.pw_file}",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": str(self.pw_file),
                    "content": f"$stack.{self.db}/prod.{PW}.result",
                },
            },
        )

    def _spec(self, name: str, *resources: dict[str, Any]) -> None:
        (self.root / name).write_text(yaml.safe_dump({"resources": list(resources)}))

    def stacks(self) -> list[str]:
        return [f"{self.net}/prod", f"{self.db}/prod", f"{self.svc}/prod"]


async def history_texts(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Every payload of the run's history, decoded by stackflow's codec, as text."""
    codec = payload_codec()
    texts = []
    async for event in handle.fetch_history_events():
        for found in _payloads(MessageToDict(event)):
            [plain] = await codec.decode([ParseDict(found, Payload())])
            texts.append(plain.data.decode(errors="replace"))
    return texts


def _payloads(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        if "data" in value and "metadata" in value:
            return [value]
        return [p for v in value.values() for p in _payloads(v)]
    if isinstance(value, list):
        return [p for v in value for p in _payloads(v)]
    return []


def _secret(api: k8s.ApiClient, name: str) -> dict[str, str]:
    data = k8s.CoreV1Api(api).read_namespaced_secret(name, "default").data
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _password(env: dict[str, str], project: str) -> str:
    backend = releases(env)
    try:
        stack = StackRef(project, "prod")
        revision = backend.latest_succeeded_revision(stack)
        assert revision is not None
        state = backend.resource_state(stack, revision, PW)
        assert state is not None
        return str(state.attributes["result"])
    finally:
        backend.close()


async def test_a_set_previews_applies_in_order_and_rolls_back(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
    temporal_client: Client,
) -> None:
    env = stack_env
    shop = Shop(tmp_path)
    net, db, svc = shop.stacks()

    # First preview: nothing exists; what the service reads is known only after apply.
    first = _members(_run(env, "preview", "-f", str(shop.file)))
    assert first[net]["counts"].get("Create") == 1 and first[db]["counts"].get("Create") == 1
    assert sorted(first[svc]["unknown"]) == sorted(
        [f"$stack.{db}.{PW}.result", f"$stack.{net}.{shop.conf_id}.content"]
    )
    assert first[svc]["counts"] == {"Create": 2}
    assert not (tmp_path / "net").exists()  # a preview changes nothing

    # Apply: in order, values flow downstream.
    applied = _run(env, "apply", "-f", str(shop.file), "--yes")
    assert applied["phase"] == "succeeded", applied
    assert {m["phase"] for m in applied["members"]} == {"succeeded"}
    password = _password(env, shop.db)
    assert _secret(api, shop.secret) == {"password": password, "cidr": "10.0.0.0/16\n"}
    assert shop.pw_file.read_text() == password
    # the value is a secret downstream too: not in the release views, not in history
    shown = run_cli(env, "release", "show", "-p", shop.svc, "-w", "prod", "-o", "json")
    assert shown.returncode == 0 and "(sensitive value)" in shown.stdout, shown.stderr
    assert password not in shown.stdout
    for wid in (set_workflow_id(applied["name"]), f"stackflow/{svc}", f"stackflow/{db}"):
        texts = await history_texts(temporal_client.get_workflow_handle(wid))
        assert texts and not [t for t in texts if password in t], wid
    created = {s: all_releases(env, *s.split("/"))[-1].created_at for s in (net, db, svc)}
    assert created[net] < created[db] < created[svc]

    # Preview after: everything UnChanged, no value unknown.
    again = _members(_run(env, "preview", "-f", str(shop.file)))
    for stack in (net, db, svc):
        assert set(again[stack]["counts"]) == {"UnChanged"}, again[stack]
        assert again[stack]["unknown"] == []

    # A changed upstream value: known after apply in the preview, re-applied downstream in
    # the same set run.
    shop.write(cidr="10.1.0.0/16\n", length=16)
    moved = _members(_run(env, "preview", "-f", str(shop.file)))
    assert moved[net]["counts"] == {"Update": 1}
    assert moved[svc]["unknown"] == [f"$stack.{net}.{shop.conf_id}.content"]
    assert moved[svc]["counts"] == {"Update": 1, "UnChanged": 1}
    _run(env, "apply", "-f", str(shop.file), "--yes")
    assert _secret(api, shop.secret) == {"password": password, "cidr": "10.1.0.0/16\n"}
    assert [len(all_releases(env, *s.split("/"))) for s in (net, db, svc)] == [2, 2, 2]

    # The middle stack fails: its dependent is skipped; rollback restores the network.
    shop.write(cidr="10.2.0.0/16\n", length="long")
    failed = _run(env, "apply", "-f", str(shop.file), "--yes", "--on-failure", "rollback", code=1)
    by = _members(failed)
    assert failed["phase"] == "failed" and failed["error_type"] == "StackFailed"
    assert by[db]["phase"] == "failed" and "length" in by[db]["error"]
    assert by[svc]["phase"] == "skipped" and db in by[svc]["error"]
    assert by[net]["phase"] == "rolledBack" and failed["rolled_back"] == [net]
    assert shop.conf.read_text() == "10.1.0.0/16\n"
    net_releases = all_releases(env, shop.net, "prod")
    assert [(r.operation, r.phase) for r in net_releases] == [
        (Operation.apply, Phase.succeeded),
        (Operation.apply, Phase.succeeded),
        (Operation.apply, Phase.succeeded),
        (Operation.rollback, Phase.succeeded),
    ]
    assert net_releases[-1].source_revision == 2
    assert len(all_releases(env, shop.svc, "prod")) == 2  # never started
    assert _password(env, shop.db) == password
    assert _secret(api, shop.secret) == {"password": password, "cidr": "10.1.0.0/16\n"}

    # Destroy: dependents first; nothing is left.
    shop.write(cidr="10.0.0.0/16\n", length=16)
    gone = _run(env, "destroy", "-f", str(shop.file), "--yes")
    assert {m["phase"] for m in gone["members"]} == {"succeeded"}
    destroyed = {s: all_releases(env, *s.split("/"))[-1] for s in (net, db, svc)}
    # the service read the others: its destroy ended before theirs began (no dependsOn said so)
    assert destroyed[svc].modified_at < destroyed[db].created_at
    assert destroyed[db].modified_at < destroyed[net].created_at
    assert {r.operation for r in destroyed.values()} == {Operation.destroy}
    assert not shop.conf.exists()
    try:
        k8s.CoreV1Api(api).read_namespaced_secret(shop.secret, "default")
        raise AssertionError("the Secret is still there")
    except k8s.ApiException as exc:
        assert exc.status == 404


def test_a_bad_set_is_one_line_and_runs_nothing(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    shop = Shop(tmp_path)
    secret_id = f"v1:Secret:default:{shop.secret}"
    # a cycle through references: the service reads the network, which reads the service
    shop.write(cidr=f"$stack.{shop.svc}/prod.{secret_id}.kind", length=16)
    proc: subprocess.CompletedProcess[str] = _run(
        stack_env, "apply", "-f", str(shop.file), "--yes", code=2
    )
    line = proc.stderr.strip().splitlines()[-1]
    assert "a cycle between stacks:" in line and shop.svc in line and shop.db in line, proc.stderr
    # a reference to a field of a resource the stack does not have
    shop.write(cidr="x\n", length=16)
    service = (tmp_path / "service.yaml").read_text().replace(f"{PW}.result", "pw.result")
    (tmp_path / "service.yaml").write_text(service)
    proc = _run(stack_env, "preview", "-f", str(shop.file), code=2)
    assert f"$stack.{shop.db}/prod.pw.result: stack {shop.db}/prod has no such resource" in (
        proc.stderr
    )
    assert not (tmp_path / "net").exists()
