"""What the engine asks of the Terraform runtime (cheap to import: no OpenTofu)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from stackflow.model.runtime_rules import RuntimeRules

if TYPE_CHECKING:
    from stackflow.runtimes.base import Runtime
    from stackflow.state.backend import StateBackend

TYPE_NAME = "Terraform"
ID = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")


class TerraformRules(RuntimeRules):
    type_name: ClassVar[str] = TYPE_NAME
    grouped: ClassVar[bool] = True
    """Grouped only in runs that have the ``group-terraform-nodes`` patch (its runtime runs
    a group's concurrent calls as one tofu command)."""

    def create(self, backend: StateBackend | None) -> Runtime:
        from stackflow.runtimes.terraform.runtime import TerraformRuntime

        return TerraformRuntime(backend=backend)

    def id_problem(self, resource_id: str) -> str | None:
        if ID.match(resource_id):
            return None
        return "a Terraform id is <provider namespace>:<provider name>:<resource type>:<name>"


RULES = TerraformRules()
"""Sensitive values: OpenTofu marks them, and the runtime records their paths under
``_stackflow_sensitive`` (masked by :func:`stackflow.engine.masking.sensitive_paths_for` for any
runtime), so no attribute is secret by name here."""
