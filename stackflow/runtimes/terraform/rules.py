"""What the engine asks of the Terraform runtime (cheap to import: no OpenTofu)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from stackflow.model.runtime_rules import Grouping, RuntimeRules

TYPE_NAME = "Terraform"
ID = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")

IMPORT_ID_KEY = "kusionstack.io/import-id"
"""Kusion's extension naming the existing object a Terraform resource imports."""


class TerraformRules(RuntimeRules):
    type_name: ClassVar[str] = TYPE_NAME
    runtime: ClassVar[str] = "stackflow.runtimes.terraform.runtime:TerraformRuntime"
    policy_section: ClassVar[str | None] = "stackflow.runtimes.policy:TerraformPolicy"
    backend_argument: ClassVar[str | None] = "backend"
    grouped: ClassVar[bool] = True
    grouping: ClassVar[Grouping] = Grouping(limit=256)
    """A group takes every ready node, up to 256 (the runtime's ``BATCH_LIMIT``): its
    runtime runs a group's concurrent calls as one tofu command."""

    def takes_over(self, extensions: Mapping[str, Any]) -> str | None:
        if extensions.get(IMPORT_ID_KEY) not in (None, ""):
            return f"imports an existing object (extensions[{IMPORT_ID_KEY!r}])"
        return None

    def id_problem(self, resource_id: str) -> str | None:
        if ID.match(resource_id):
            return None
        return "a Terraform id is <provider namespace>:<provider name>:<resource type>:<name>"


RULES = TerraformRules()
"""Sensitive values: OpenTofu marks them, and the runtime records their paths under
``_stackflow_sensitive`` (masked by :func:`stackflow.engine.masking.sensitive_paths_for` for any
runtime), so no attribute is secret by name here."""
