"""Helpers for the Kubernetes runtime tests: manifests, requests, a plain client, cleanup."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import time
import uuid
from collections.abc import Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from stackflow.runtimes.base import ResourceRequest
from tests.integration.conftest import REPO

Obj = dict[str, Any]


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def kusion_id(obj: Obj) -> str:
    md = obj["metadata"]
    parts = [obj["apiVersion"], obj["kind"], md.get("namespace"), md["name"]]
    return ":".join(p for p in parts if p)


def resource(obj: Obj, *, deps: list[str] | None = None, **extensions: Any) -> Obj:
    """A spec resource of type Kubernetes for ``obj``."""
    res: Obj = {"id": kusion_id(obj), "type": "Kubernetes", "attributes": obj}
    if deps:
        res["dependsOn"] = deps
    if extensions:
        res["extensions"] = extensions
    return res


def request(obj: Obj, *, prior: Obj | None = None, **extensions: Any) -> ResourceRequest:
    return ResourceRequest(
        id=kusion_id(obj),
        type="Kubernetes",
        attributes=copy.deepcopy(obj),
        extensions=extensions,
        prior_state=prior,
    )


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def config_map(ns: str, name: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


def secret(ns: str, name: str, string_data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "type": "Opaque",
        "stringData": string_data,
    }


def deployment(ns: str, name: str, replicas: int = 1, image: str = "nginx:1.25") -> Obj:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "web", "image": image, "ports": [{"containerPort": 80}]}
                    ]
                },
            },
        },
    }


def service(ns: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}],
            "type": "ClusterIP",
        },
    }


def job(ns: str, name: str) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "once", "image": "busybox:1.36"}],
                }
            },
        },
    }


def crd(group: str, kind: str = "Widget", plural: str = "widgets") -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {"type": "integer", "default": 1},
                                        "color": {"type": "string"},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def widget(group: str, ns: str, name: str, color: str) -> Obj:
    return {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"color": color},
    }


def api_client(kubeconfig: str) -> k8s.ApiClient:
    api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return api


def delete_quietly(
    api: k8s.ApiClient, *, namespaces: Sequence[str] = (), crds: Sequence[str] = ()
) -> None:
    """Best-effort cleanup that does not wait (the namespace controller finishes it)."""
    core = k8s.CoreV1Api(api)
    ext = k8s.ApiextensionsV1Api(api)
    for name in namespaces:
        with contextlib.suppress(Exception):  # already gone, or never made
            core.delete_namespace(name)
    for name in crds:
        with contextlib.suppress(Exception):
            ext.delete_custom_resource_definition(name)


def services(action: str, *names: str) -> None:
    """Start or stop dev services with the project's own script."""
    subprocess.run(
        [str(REPO / "scripts" / "services.sh"), action, *names],
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )


def wait_for(probe: Any, *, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
