"""Large objects never travel through history uncapped: ten CRDs of 500-900 KB with custom
resources of each, and twenty 900 KB ConfigMaps, apply and then preview all UnChanged, with
no payload warning from the Temporal server and every history payload within the budget."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.engine.budget import BUDGET
from stackflow.temporal.operation import workflow_id_for
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, write_spec

_TEXT = (
    "the of controller resource specification field value when must should may reconcile "
    "status condition replicas template selector label annotation namespace secret config "
    "volume mount container port protocol service endpoint ingress route tls certificate "
    "issuer duration renew"
)
WORDS = _TEXT.split()
PAYLOAD_WARNINGS = ("blob size exceeds", "history size exceeds", "larger than max")


def sentence(n: int) -> str:
    return " ".join(WORDS[(n * 7 + k * 13) % len(WORDS)] for k in range(30))


def crd(group: str, index: int, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A CRD whose schema is about ``size`` bytes of JSON, and one custom resource of it."""
    kind, plural = f"Widget{index}", f"widgets{index}"
    props: dict[str, Any] = {}
    n = 0
    while n % 200 or len(json.dumps(props)) < size:
        props[f"field{n:05d}"] = {"type": "string", "description": f"Field {n}: {sentence(n)}"}
        n += 1
    definition = {
        "id": f"apiextensions.k8s.io/v1:CustomResourceDefinition:{plural}.{group}",
        "type": "Kubernetes",
        "attributes": {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": f"widget{index}"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {"spec": {"type": "object", "properties": props}},
                            }
                        },
                    }
                ],
            },
        },
    }
    custom = {
        "id": f"{group}/v1:{kind}:default:one",
        "type": "Kubernetes",
        "dependsOn": [definition["id"]],
        "attributes": {
            "apiVersion": f"{group}/v1",
            "kind": kind,
            "metadata": {"name": "one", "namespace": "default"},
            "spec": {"field00000": "hello", "field00001": sentence(index)},
        },
    }
    return definition, custom


def config_map(name: str, size: int) -> dict[str, Any]:
    lines, n = [], 0
    while sum(map(len, lines)) < size:
        lines.append(f"key{n:06d} = {sentence(n)}\n")
        n += 1
    return {
        "id": f"v1:ConfigMap:default:{name}",
        "type": "Kubernetes",
        "attributes": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"app.conf": "".join(lines)},
        },
    }


def server_log() -> Path:
    return Path(os.environ.get("STACKFLOW_RUN_DIR", REPO / ".run")) / "logs" / "temporal.log"


def payload_sizes(message: Any) -> list[int]:
    """Sizes of every Payload inside a protobuf message, however deep."""
    from temporalio.api.common.v1 import Payload

    if isinstance(message, Payload):
        return [message.ByteSize()]
    sizes: list[int] = []
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if hasattr(value, "ListFields"):
            sizes += payload_sizes(value)
            continue
        items = value.values() if hasattr(value, "values") else value  # repeated or map
        for item in items:
            if hasattr(item, "ListFields"):
                sizes += payload_sizes(item)
    return sizes


async def largest_payload(client: Client, workflow_id: str) -> int:
    """The largest payload (bytes as stored) of any event of the run's history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return max((size for event in history.events for size in payload_sizes(event)), default=0)


async def apply_then_preview_unchanged(
    tmp_path: Path,
    env: dict[str, str],
    client: Client,
    resources: list[dict[str, Any]],
    name: str,
) -> None:
    project = f"big{uuid.uuid4().hex[:8]}"
    spec = write_spec(tmp_path / f"{name}.yaml", resources)
    log = server_log()
    start = log.stat().st_size
    flags = ("-p", project, "-o", "json")
    applied = cli_json(run_cli(env, "apply", "-f", str(spec), "--yes", *flags, timeout=600))
    assert applied["phase"] == "succeeded", applied.get("error")
    assert applied["counts"] == {"succeeded": len(resources)}
    again = cli_json(run_cli(env, "preview", "-f", str(spec), *flags, timeout=600))
    assert again["summary"]["UnChanged"] == len(resources), again["summary"]
    # the apply's own history: every payload within the budget (the spec went by reference)
    assert await largest_payload(client, workflow_id_for(StackRef(project, "default"))) < BUDGET
    with log.open("rb") as handle:
        handle.seek(start)
        new = handle.read().decode(errors="replace").lower()
    warned = [line for line in new.splitlines() if any(w in line for w in PAYLOAD_WARNINGS)]
    assert not warned, warned[:3]
    destroyed = run_cli(env, "destroy", "-p", project, "--yes", timeout=600)
    assert destroyed.returncode == 0, destroyed.stderr


async def test_ten_big_crds_with_custom_resources(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    kubeconfig: str,
    temporal_client: Client,
) -> None:
    group = f"g{uuid.uuid4().hex[:6]}.stackflow.test"
    resources: list[dict[str, Any]] = []
    for i in range(10):
        definition, custom = crd(group, i, 500_000 + 40_000 * i)
        resources += [definition, custom]
    await apply_then_preview_unchanged(tmp_path, stack_env, temporal_client, resources, "crds")


async def test_twenty_900kb_config_maps(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    kubeconfig: str,
    temporal_client: Client,
) -> None:
    prefix = f"big-{uuid.uuid4().hex[:6]}"
    resources = [config_map(f"{prefix}-{i:02d}", 900_000) for i in range(20)]
    await apply_then_preview_unchanged(tmp_path, stack_env, temporal_client, resources, "cms")
