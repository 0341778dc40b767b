"""Planted secrets never leave in clear: a Kubernetes Secret, a Terraform sensitive result
handed through $kusion_path to a plain field, and a context.env credential go through
preview, apply, release show, output and destroy; then the CLI's output (tables and JSON),
the state backend's raw rows, Redis' raw values, the Temporal histories, every file under
STACKFLOW_HOME and the worker's log are searched for them (plain and base64)."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
import yaml

from stackflow.state.backend import open_backend
from stackflow.state.schema import metadata
from tests.integration.conftest import WorkerProcess, run_cli

RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"


def forms(secret: str) -> list[str]:
    return [secret, base64.b64encode(secret.encode()).decode()]


def test_planted_secrets_are_found_nowhere(
    tmp_path: Path, stack_env: dict[str, str], kubeconfig: str
) -> None:
    assert stack_env.get("STACKFLOW_ENCRYPTION_KEY_FILE"), "the dev loop encrypts"
    tag = uuid.uuid4().hex[:8]
    k8s_secret, env_secret = f"k8s-{tag}-Sup3r", f"ctx-{tag}-T0ken"
    env = dict(stack_env, STACKFLOW_ALLOWED_ENV="RANDOM_TEST_TOKEN")
    home = Path(env["STACKFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    worker = WorkerProcess(home, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    project = f"sec{tag}"
    pw_id = "hashicorp:random:random_password:pw"
    motd = tmp_path / "outside-home" / "motd"
    spec = {
        "context": {"env": {"RANDOM_TEST_TOKEN": env_secret}},
        "resources": [
            {
                "id": f"v1:Secret:default:s-{tag}",
                "type": "Kubernetes",
                "attributes": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"s-{tag}", "namespace": "default"},
                    "stringData": {"password": k8s_secret},
                },
            },
            {
                "id": pw_id,
                "type": "Terraform",
                "attributes": {"length": 20, "special": False},
                "extensions": {"provider": RANDOM, "resourceType": "random_password"},
            },
            {
                "id": f"onprem:File:{motd}",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": str(motd),
                    "content": f"$kusion_path.{pw_id}.result",
                },
            },
        ],
    }
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    flags = ("-p", project)
    outputs: list[str] = []

    def cli(*args: str, code: int = 0) -> str:
        proc = run_cli(env, *args)
        assert proc.returncode == code, proc.stdout + proc.stderr
        outputs.append(proc.stdout + proc.stderr)
        return proc.stdout

    try:
        cli("preview", "-f", str(spec_file), *flags)
        cli("preview", "-f", str(spec_file), *flags, "-o", "json")
        cli("apply", "-f", str(spec_file), *flags, "--yes", "-o", "json")
        cli("preview", "-f", str(spec_file), *flags, "-o", "json")
        cli("release", "show", *flags, "-o", "json")
        cli("release", "show", *flags)
        cli("output", *flags)
        cli("output", *flags, "-o", "table")
        # the one explicit way to see a value
        shown = run_cli(env, "output", *flags, "-r", pw_id, "--show-sensitive")
        assert shown.returncode == 0, shown.stderr
        password = json.loads(shown.stdout)[pw_id]["result"]
        assert len(password) == 20 and motd.read_text() == password
        cli("destroy", *flags, "--yes", "-o", "json")
    finally:
        worker.stop()
    planted = [*forms(k8s_secret), *forms(env_secret), *forms(password)]

    def leaks(where: str, text: str) -> None:
        found = [p for p in planted if p in text]
        assert not found, f"{where} holds a secret in clear"

    for number, text in enumerate(outputs):
        leaks(f"CLI output #{number}", text)
    leaks("the worker log", worker.log.read_text(errors="replace"))
    for path in home.rglob("*"):
        if path.is_file():
            leaks(str(path), path.read_bytes().decode(errors="replace"))
    backend = open_backend(env["STACKFLOW_STATE_URL"], keys=None)
    try:
        with backend.engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(sa.select(table)):
                    leaks(f"table {table.name}", repr(tuple(row)))
    finally:
        backend.close()
    cache = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    for key in cache.scan_iter(match=f"stackflow:prior:{project}/*"):
        leaks(f"redis {key}", json.dumps(cache.hgetall(key)))
    runs = subprocess.run(
        [
            "temporal",
            "workflow",
            "list",
            "--query",
            f'WorkflowId STARTS_WITH "stackflow/{project}/"',
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert runs.returncode == 0, runs.stderr
    listed: list[dict[str, Any]] = json.loads(runs.stdout or "[]")
    assert len(listed) >= 3
    for run in listed:
        history = subprocess.run(
            [
                "temporal",
                "workflow",
                "show",
                "--workflow-id",
                run["execution"]["workflowId"],
                "--run-id",
                run["execution"]["runId"],
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert history.returncode == 0, history.stderr
        leaks(f"history of {run['execution']['workflowId']}", history.stdout)
        raw = json.loads(history.stdout)
        # payloads are base64 in the JSON: look inside them too
        for event in raw.get("events", []):
            for text in _payload_texts(event):
                leaks(f"a payload of {run['execution']['workflowId']}", text)


def _payload_texts(value: Any) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict):
        if "data" in value and "metadata" in value and isinstance(value["data"], str):
            out.append(base64.b64decode(value["data"]).decode(errors="replace"))
        for v in value.values():
            out += _payload_texts(v)
    elif isinstance(value, list):
        for v in value:
            out += _payload_texts(v)
    return out
