"""What the engine asks of the Kubernetes runtime (cheap to import: no client)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from stackflow.runtime_rules import RuntimeRules

if TYPE_CHECKING:
    from runtimes.base import Runtime
    from stackflow.state.backend import StateBackend

TYPE_NAME = "Kubernetes"
ID = re.compile(r"^[^:\s]+:[^:\s]+(:[^:\s]+)?:[^:\s]+$")
SECRET_FIELDS = ["data", "stringData"]


def scope_key(attributes: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What a preview batch's reads are counted by (:class:`runtimes.base.ReadScope`): one
    listing of a kind in a namespace answers all the batch's reads of it."""
    metadata = attributes.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return (attributes.get("apiVersion"), attributes.get("kind"), namespace)


class KubernetesRules(RuntimeRules):
    type_name: ClassVar[str] = TYPE_NAME
    grouped: ClassVar[bool] = True

    def create(self, backend: StateBackend | None) -> Runtime:
        from runtimes.kubernetes.runtime import KubernetesRuntime

        return KubernetesRuntime()

    def id_problem(self, resource_id: str) -> str | None:
        if ID.match(resource_id):
            return None
        return (
            "a Kubernetes id is <apiVersion>:<Kind>:<namespace>:<name> "
            "(cluster-scoped: <apiVersion>:<Kind>:<name>)"
        )

    def sensitive_paths(self, attributes: Mapping[str, Any]) -> list[str]:
        return list(SECRET_FIELDS) if attributes.get("kind") == "Secret" else []


RULES = KubernetesRules()
