"""An operator bundle in one spec: CustomResourceDefinitions and custom resources of each,
applied from nothing again and again through the real CLI, worker and control plane.

The worker is one process for all the runs of a test, as in production: its discovery
cache still holds the kinds of the run before when their CRDs are created again, the case
that used to fail with ``404 page not found``. Every test has its own CRD group.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from stackflow.runtimes.base import RuntimeOptions
from stackflow.runtimes.kubernetes import KubernetesRuntime
from stackflow.runtimes.kubernetes.client import KubeClient
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.kubehelp import (
    delete_quietly,
    kusion_id,
    namespace,
    request,
    resource,
    suffix,
)
from tests.integration.opshelp import cli_json, expect_exit, new_project, write_spec
from tests.integration.test_big_objects import WORDS

Obj = dict[str, Any]
RUNS = 5
BIG = 256 * 1024
KINDS = [
    # kind, plural, whether its schema is over 256 KB (a pod template of many containers)
    ("Prometheus", "prometheuses", True),
    ("Alertmanager", "alertmanagers", True),
    ("ThanosRuler", "thanosrulers", False),
    ("PrometheusAgent", "prometheusagents", False),
    ("ServiceMonitor", "servicemonitors", False),
    ("PodMonitor", "podmonitors", False),
    ("Probe", "probes", False),
    ("PrometheusRule", "prometheusrules", False),
    ("ScrapeConfig", "scrapeconfigs", False),
    ("AlertmanagerConfig", "alertmanagerconfigs", False),
]


def _text(n: int, words: int = 24) -> str:
    return " ".join(WORDS[(n * 7 + k * 13) % len(WORDS)] for k in range(words))


def _string(n: int, **extra: Any) -> Obj:
    return {"type": "string", "description": _text(n), **extra}


def _container(n: int) -> Obj:
    """A container's schema, as operators copy it from the pod spec (abridged)."""
    port = {
        "type": "object",
        "required": ["containerPort"],
        "properties": {
            "name": _string(n + 1, maxLength=15),
            "containerPort": {"type": "integer", "format": "int32", "description": _text(n + 2)},
            "protocol": _string(n + 3, enum=["TCP", "UDP", "SCTP"], default="TCP"),
        },
    }
    env = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _string(n + 4),
            "value": _string(n + 5),
            "valueFrom": {
                "type": "object",
                "description": _text(n + 6),
                "properties": {
                    source: {
                        "type": "object",
                        "description": _text(n + 7 + i),
                        "properties": {"name": _string(n + 8 + i), "key": _string(n + 9 + i)},
                    }
                    for i, source in enumerate(["configMapKeyRef", "secretKeyRef", "fieldRef"])
                },
            },
        },
    }
    quantity = {"x-kubernetes-int-or-string": True, "description": _text(n + 12)}
    resources = {
        "type": "object",
        "properties": {
            part: {"type": "object", "additionalProperties": quantity, "description": _text(n)}
            for part in ("limits", "requests")
        },
    }
    probe = {
        "type": "object",
        "properties": {
            "httpGet": {
                "type": "object",
                "properties": {"path": _string(n + 13), "port": quantity},
            },
            **{
                field: {"type": "integer", "format": "int32", "description": _text(n + 14 + i)}
                for i, field in enumerate(
                    ["initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold"]
                )
            },
        },
    }
    return {
        "type": "object",
        "required": ["name"],
        "description": _text(n, 60),
        "properties": {
            "name": _string(n),
            "image": _string(n + 20),
            "imagePullPolicy": _string(n + 21, enum=["Always", "IfNotPresent", "Never"]),
            "args": {"type": "array", "items": {"type": "string"}, "description": _text(n + 22)},
            "command": {"type": "array", "items": {"type": "string"}, "description": _text(n)},
            "env": {
                "type": "array",
                "items": env,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
            "ports": {"type": "array", "items": port, "description": _text(n + 23)},
            "resources": resources,
            "livenessProbe": probe,
            "readinessProbe": probe,
            "startupProbe": probe,
            "workingDir": _string(n + 24),
        },
    }


def _spec_schema(index: int, big: bool) -> Obj:
    properties: Obj = {
        "replicas": {"type": "integer", "format": "int32", "minimum": 0, "description": _text(1)},
        "version": _string(2, pattern="^v[0-9]+\\.[0-9]+\\.[0-9]+$"),
        "paused": {"type": "boolean", "description": _text(3)},
        "retention": _string(4, default="24h"),
        "serviceAccountName": _string(5),
        "nodeSelector": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": _text(6),
        },
        "labels": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
    # the pod template operators embed: containers, initContainers, sidecars…, enough of
    # them for the schema to pass 256 KB of JSON where ``big``
    groups = 24 if big else 2
    for g in range(groups):
        properties[f"containers{g:02d}" if g else "containers"] = {
            "type": "array",
            "description": _text(index + g, 40),
            "items": _container(index * 100 + g),
        }
    return {
        "type": "object",
        "description": _text(index, 80),
        "properties": {
            "apiVersion": _string(7),
            "kind": _string(8),
            "metadata": {"type": "object"},
            "spec": {"type": "object", "required": ["replicas"], "properties": properties},
            "status": {
                "type": "object",
                "properties": {
                    "availableReplicas": {"type": "integer", "format": "int32"},
                    "conditions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "status"],
                            "properties": {
                                "type": _string(9),
                                "status": _string(10, enum=["True", "False", "Unknown"]),
                                "message": _string(11),
                            },
                        },
                    },
                },
            },
        },
    }


def crd(group: str, index: int, kind: str, plural: str, big: bool) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.1"},
        },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["monitoring"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Version", "type": "string", "jsonPath": ".spec.version"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                    ],
                    "schema": {"openAPIV3Schema": _spec_schema(index, big)},
                }
            ],
        },
    }


def custom(group: str, ns: str, kind: str, index: int) -> Obj:
    return {
        "apiVersion": f"{group}/v1",
        "kind": kind,
        "metadata": {"name": kind.lower(), "namespace": ns},
        "spec": {
            "replicas": 1 + index % 3,
            "version": f"v2.{index}.0",
            "serviceAccountName": kind.lower(),
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "containers": [
                {
                    "name": "main",
                    "image": f"quay.io/example/{kind.lower()}:v2.{index}.0",
                    "args": ["--log.level=info"],
                    "env": [{"name": "MODE", "value": "bundle"}],
                    "ports": [{"name": "web", "containerPort": 9090 + index}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


def bundle(group: str, ns: str) -> tuple[list[Obj], list[str]]:
    """The spec's resources (a Namespace, ten CRDs, a custom resource of each depending on
    its CRD and the Namespace) and the CRDs' names."""
    ns_obj = namespace(ns)
    resources, names = [resource(ns_obj)], []
    for index, (kind, plural, big) in enumerate(KINDS):
        definition = crd(group, index, kind, plural, big)
        if big:
            assert len(json.dumps(definition)) > BIG
        resources.append(resource(definition))
        names.append(definition["metadata"]["name"])
        # deleted in the background: foreground deletion of a kind the garbage collector has
        # not resynced yet waits up to 30 s for it (see runtimes/kubernetes/runtime.py)
        resources.append(
            resource(
                custom(group, ns, kind, index),
                deps=[kusion_id(definition), kusion_id(ns_obj)],
                deletionPropagation="Background",
            )
        )
    return resources, names


def _crds_left(ext: k8s.ApiextensionsV1Api, names: list[str]) -> list[str]:
    """Which of the CRDs ``names`` the API server has (the test's group is its own)."""
    found = []
    for name in names:
        try:
            ext.read_custom_resource_definition(name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
        else:
            found.append(name)
    return found


def test_an_operator_bundle_applies_from_nothing_five_times_in_a_row(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, api: k8s.ApiClient
) -> None:
    env, project = stack_env, new_project()
    group, ns = f"g{suffix()}.monitoring.stackflow.test", f"sf-{suffix()}"
    resources, names = bundle(group, ns)
    spec = write_spec(tmp_path / "bundle.yaml", resources)
    flags = ("--project", project, "--output", "json")
    ext = k8s.ApiextensionsV1Api(api)
    timings: list[tuple[float, float]] = []
    try:
        for run in range(RUNS):
            started = time.monotonic()
            applied = cli_json(expect_exit(run_cli(env, "apply", "-f", str(spec), "--yes", *flags)))
            apply_seconds = time.monotonic() - started
            assert applied["phase"] == "succeeded", (run, applied.get("error"))
            assert applied["counts"] == {"succeeded": len(resources)}, (run, applied["counts"])
            assert _crds_left(ext, names) == names
            served = k8s.CustomObjectsApi(api).list_namespaced_custom_object(
                group, "v1", ns, "prometheuses"
            )
            assert [item["spec"]["replicas"] for item in served["items"]] == [1]
            if run == RUNS - 1:
                timings.append((apply_seconds, 0.0))
                break
            started = time.monotonic()
            destroyed = cli_json(expect_exit(run_cli(env, "destroy", "--yes", *flags)))
            timings.append((apply_seconds, time.monotonic() - started))
            assert destroyed["phase"] == "succeeded", (run, destroyed.get("error"))
            # nothing left for the next run: the destroy returned once each CRD was gone
            # from the API server (their finalizer first removes every custom resource)
            assert _crds_left(ext, names) == [], run
        again = cli_json(expect_exit(run_cli(env, "preview", "-f", str(spec), *flags)))
        assert again["summary"]["UnChanged"] == len(resources), again["summary"]
        assert {c["action"] for c in again["changes"]} == {"UnChanged"}
        print(
            "\napply / destroy seconds per run: "
            + ", ".join(f"{a:.1f}/{d:.1f}" for a, d in timings)
        )
    finally:  # the last run's objects: removed in the background (destroy was shown above)
        delete_quietly(api, namespaces=[ns], crds=names)


def test_a_crd_and_its_custom_resource_without_depends_on_preview_apply_and_destroy(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, api: k8s.ApiClient
) -> None:
    env, project = stack_env, new_project()
    group, ns = f"g{suffix()}.stackflow.test", f"sf-{suffix()}"
    ns_obj = namespace(ns)
    definition = crd(group, 0, "Probe", "probes", False)
    item = custom(group, ns, "Probe", 0)
    # written as people write them: the custom resource names its namespace, not its CRD,
    # and comes first in the spec
    resources = [
        resource(item, deps=[kusion_id(ns_obj)], deletionPropagation="Background"),
        resource(ns_obj),
        resource(definition),
    ]
    spec = write_spec(tmp_path / "spec.yaml", resources)
    flags = ("--project", project, "--output", "json")
    try:
        graph = json.loads(expect_exit(run_cli(env, "graph", "-f", str(spec), "-o", "json")).stdout)
        assert [kusion_id(definition), kusion_id(item)] in graph["edges"]  # the implicit edge
        # nothing in the cluster: the CRD and the custom resource of its kind both Create
        first = cli_json(expect_exit(run_cli(env, "preview", "-f", str(spec), *flags)))
        actions = {c["id"]: c["action"] for c in first["changes"]}
        assert actions == {r["id"]: "Create" for r in resources}, actions
        applied = cli_json(expect_exit(run_cli(env, "apply", "-f", str(spec), "--yes", *flags)))
        assert applied["counts"] == {"succeeded": 3}, applied
        order = [r["id"] for r in applied["results"]]
        assert order.index(kusion_id(definition)) < order.index(kusion_id(item))
        destroyed = cli_json(expect_exit(run_cli(env, "destroy", "--yes", *flags)))
        assert destroyed["phase"] == "succeeded"
        gone = [r["id"] for r in destroyed["results"]]
        assert gone.index(kusion_id(item)) < gone.index(kusion_id(definition))
        assert not _crds_left(k8s.ApiextensionsV1Api(api), [definition["metadata"]["name"]])
    finally:
        delete_quietly(api, namespaces=[ns], crds=[definition["metadata"]["name"]])


def test_a_custom_resource_no_crd_defines_is_bad_input_naming_the_kind(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    group = f"g{suffix()}.stackflow.test"
    item = custom(group, "default", "Prometheus", 0)
    spec = write_spec(tmp_path / "spec.yaml", [resource(item)])
    proc = expect_exit(
        run_cli(stack_env, "apply", "-f", str(spec), "--yes", "--project", new_project()), 2
    )
    assert "kind Prometheus" in proc.stderr
    assert "no CustomResourceDefinition defines kind Prometheus" in proc.stderr
    assert "does its namespace exist" not in proc.stderr


async def test_a_worker_whose_discovery_predates_the_crd_applies_its_custom_resource(
    rt: KubernetesRuntime, api: k8s.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker deleted the CRD and made it again (no wait): this runtime's discovery
    still lists the kind from before, and its apply comes while the new CRD may not be
    established yet, which the server answers with ``404 page not found``."""
    opts = RuntimeOptions(project=new_project(), workspace="dev", timeout_seconds=60)
    group = f"g{suffix()}.stackflow.test"
    definition = crd(group, 0, "Probe", "probes", False)
    name = definition["metadata"]["name"]
    item = custom(group, "default", "Probe", 0)
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    answers: list[int] = []
    real = KubeClient.request

    def counted(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
        try:
            return real(self, method, path, **kw)
        except Exception as exc:
            if method == "PATCH" and "/probes/" in path:
                answers.append(getattr(exc, "status", 0))
            raise

    try:
        await rt.apply(request(definition), opts)
        await rt.apply(request(item, deletionPropagation="Background"), opts)
        other = KubernetesRuntime()  # the other worker
        try:
            for _ in range(3):
                await other.delete(request(definition), opts)
                monkeypatch.setattr(KubeClient, "request", counted)
                # made again behind this runtime's back, and not waited for
                client = await asyncio.to_thread(other.kube.client_for, request(definition), opts)
                await asyncio.to_thread(client.request, "POST", crds, body=definition)
                live = await rt.apply(request(item), opts)
                monkeypatch.setattr(KubeClient, "request", real)
                assert live["spec"]["replicas"] == 1
            # the CRD goes (and its objects with it): this runtime, its discovery still
            # listing the kind, counts the custom resource as deleted
            await other.delete(request(definition), opts)
        finally:
            await other.close()
        await rt.delete(request(item, deletionPropagation="Background"), opts)
        assert await rt.read(request(item), opts) is None
        print(f"\nfailed applies answered (then retried): {answers}")
        assert set(answers) <= {404}
    finally:
        delete_quietly(api, crds=[name])
