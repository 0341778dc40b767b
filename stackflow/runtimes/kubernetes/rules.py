"""What the engine asks of the Kubernetes runtime (cheap to import: no client)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from stackflow.model.runtime_rules import Described, RuntimeRules

TYPE_NAME = "Kubernetes"
ID = re.compile(r"^[^:\s]+:[^:\s]+(:[^:\s]+)?:[^:\s]+$")
SECRET_FIELDS = ["data", "stringData"]


def _kubernetes_kind(resource: Described) -> tuple[str, str] | None:
    """(API group, kind) of a Kubernetes resource's manifest, else None."""
    if str(resource.type) != TYPE_NAME:
        return None
    api_version, kind = resource.attributes.get("apiVersion"), resource.attributes.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    return api_version.rpartition("/")[0], kind


def custom_resources(resources: Sequence[Described]) -> dict[str, list[str]]:
    """A custom resource depends on the CustomResourceDefinition of the same resources that
    defines its group and kind: applied once its kind is served, deleted before it (as
    people write them, with no ``dependsOn``)."""
    definitions: dict[tuple[str, str], str] = {}
    for resource in resources:
        if _kubernetes_kind(resource) != ("apiextensions.k8s.io", "CustomResourceDefinition"):
            continue
        spec = resource.attributes.get("spec")
        names = spec.get("names") if isinstance(spec, Mapping) else None
        group = spec.get("group") if isinstance(spec, Mapping) else None
        kind = names.get("kind") if isinstance(names, Mapping) else None
        if isinstance(group, str) and isinstance(kind, str):
            definitions.setdefault((group, kind), resource.id)
    edges: dict[str, list[str]] = {}
    if not definitions:
        return edges
    for resource in resources:
        definition = definitions.get(_kubernetes_kind(resource) or ("", ""))
        if definition is not None and definition != resource.id:
            edges[resource.id] = [definition]
    return edges


class KubernetesRules(RuntimeRules):
    type_name: ClassVar[str] = TYPE_NAME
    runtime: ClassVar[str] = "stackflow.runtimes.kubernetes.runtime:KubernetesRuntime"
    policy_section: ClassVar[str | None] = "stackflow.runtimes.policy:KubernetesPolicy"
    grouped: ClassVar[bool] = True

    def id_problem(self, resource_id: str) -> str | None:
        if ID.match(resource_id):
            return None
        return (
            "a Kubernetes id is <apiVersion>:<Kind>:<namespace>:<name> "
            "(cluster-scoped: <apiVersion>:<Kind>:<name>)"
        )

    def sensitive_paths(self, attributes: Mapping[str, Any]) -> list[str]:
        return list(SECRET_FIELDS) if attributes.get("kind") == "Secret" else []

    def takes_over(self, extensions: Mapping[str, Any]) -> str | None:
        if extensions.get("adopt"):
            return "adopts an existing object (extensions.adopt)"
        return None

    def implicit_dependencies(self, resources: Sequence[Described]) -> dict[str, list[str]]:
        return custom_resources(resources)


RULES = KubernetesRules()
