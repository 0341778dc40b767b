"""Workers per runtime (issue 24): with STACKFLOW_RUNTIME_QUEUES=on, a main worker (workflows
and bookkeeping, no runtime credentials), a Kubernetes worker (only the kubeconfig) and a
Terraform worker (only OpenTofu's settings) apply one mixed spec, each runtime's activities
on its own queue; with no Terraform worker, the run fails within the configured wait naming
the queue nobody polls."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import expect_exit

pytestmark = pytest.mark.integration

KUBE_ONLY = ("KUBECONFIG", "STACKFLOW_KUBECTL")
TF_ONLY = ("STACKFLOW_TF_BIN", "TF_CLI_CONFIG_FILE")
BUILTIN = "terraform.io/builtin/terraform"


def _env_of(worker: WorkerProcess) -> dict[str, str]:
    assert worker.proc is not None
    raw = Path(f"/proc/{worker.proc.pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.fixture
def routed(
    tmp_path: Path, stack_env: dict[str, str], kubeconfig: str
) -> Iterator[dict[str, WorkerProcess]]:
    """Three workers on one main queue: main, kubernetes, terraform (started, stopped)."""
    base = {**stack_env, "STACKFLOW_RUNTIME_QUEUES": "on", "STACKFLOW_RUNTIME_QUEUE_TIMEOUT": "8"}
    envs = {
        "main": {k: v for k, v in base.items() if k not in (*KUBE_ONLY, *TF_ONLY)},
        "kubernetes": {k: v for k, v in base.items() if k not in TF_ONLY},
        "terraform": {k: v for k, v in base.items() if k not in KUBE_ONLY},
    }
    workers = {}
    for name, env in envs.items():
        home = tmp_path / f"worker-{name}"
        home.mkdir()
        env = {**env, "STACKFLOW_WORKER_RUNTIMES": name, "STACKFLOW_HOME": str(home)}
        workers[name] = WorkerProcess(home, stack_env["STACKFLOW_TASK_QUEUE"], env)
    try:
        for worker in workers.values():
            worker.start()
        yield workers
    finally:
        for worker in workers.values():
            if worker.proc is not None and worker.proc.poll() is None:
                worker.stop()


def test_a_mixed_spec_applies_through_a_worker_per_runtime(
    tmp_path: Path, stack_env: dict[str, str], routed: dict[str, WorkerProcess]
) -> None:
    # each worker holds only its own runtime's settings
    main, kube, tf = (_env_of(routed[n]) for n in ("main", "kubernetes", "terraform"))
    assert not set(main) & {*KUBE_ONLY, *TF_ONLY}
    assert "KUBECONFIG" in kube and not set(kube) & set(TF_ONLY)
    assert "STACKFLOW_TF_BIN" in tf and not set(tf) & set(KUBE_ONLY)
    queue = stack_env["STACKFLOW_TASK_QUEUE"]
    logs = {n: w.log.read_text() for n, w in routed.items()}
    assert f"task queue '{queue}' on" in logs["main"] and "runtimes none" in logs["main"]
    assert (
        f"'{queue}-kubernetes'" in logs["kubernetes"]
        and "runtimes Kubernetes" in logs["kubernetes"]
    )
    assert f"'{queue}-terraform'" in logs["terraform"]

    ns = f"rw-{uuid.uuid4().hex[:8]}"
    resources = [
        {
            "id": f"v1:Namespace:{ns}",
            "type": "Kubernetes",
            "attributes": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        },
        {
            "id": f"v1:ConfigMap:{ns}:note",
            "type": "Kubernetes",
            "attributes": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "note", "namespace": ns},
                "data": {"text": "$kusion_path.builtin:terraform:terraform_data:note.output.text"},
            },
            "dependsOn": [f"v1:Namespace:{ns}"],
        },
        {
            "id": "builtin:terraform:terraform_data:note",
            "type": "Terraform",
            "attributes": {"input": {"text": "routed"}},
            "extensions": {"provider": BUILTIN},
        },
    ]
    spec = tmp_path / "mixed.yaml"
    spec.write_text(yaml.safe_dump({"resources": resources}))
    project = f"rw{uuid.uuid4().hex[:8]}"
    env = stack_env
    preview = expect_exit(run_cli(env, "preview", "-f", str(spec), "-p", project, "-o", "json"))
    assert json.loads(preview.stdout)["summary"]["Create"] == 3
    applied = json.loads(
        expect_exit(
            run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "-o", "json")
        ).stdout
    )
    assert applied["phase"] == "succeeded", applied
    got = run_cli(env, "output", "-p", project, "-o", "json")
    outputs = json.loads(expect_exit(got).stdout)
    assert outputs[f"v1:ConfigMap:{ns}:note"]["data"] == {"text": "routed"}

    # no Terraform worker: a run that needs one fails within the wait, naming the queue
    routed["terraform"].stop()
    resources[2]["attributes"] = {"input": {"text": "changed"}}
    spec.write_text(yaml.safe_dump({"resources": resources}))
    started = time.monotonic()
    stranded = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes")
    took = time.monotonic() - started
    assert stranded.returncode == 1, stranded.stderr
    assert (
        f"no worker polls task queue '{queue}-terraform' (Terraform resources)" in stranded.stderr
    )
    assert "within 8s" in stranded.stderr and took < 60

    # the Terraform worker back: the stack is destroyed through all three
    routed["terraform"].start()
    destroyed = run_cli(env, "destroy", "-p", project, "--yes", "-o", "json")
    assert json.loads(expect_exit(destroyed).stdout)["phase"] == "succeeded"
