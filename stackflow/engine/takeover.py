"""Resources of a spec that take over objects stackflow did not make: a Kubernetes object
adopted (``extensions.adopt: true``, or the run option ``adopt``) and a Terraform object
imported (``extensions["kusionstack.io/import-id"]``). Taking over an object that another
team runs is an approver's decision: the API refuses such a run from an operator, and a run
of a git commit (whose spec the API never sees) that takes over anything waits for an
approver whatever its ``auto_approve`` (:mod:`stackflow.workflows.waits`).
"""

from __future__ import annotations

from collections.abc import Iterable

from stackflow.model.spec import Resource

IMPORT_ID_KEY = "kusionstack.io/import-id"
"""Kusion's extension naming the existing object a Terraform resource imports (the Terraform
runtime reads it; the core knows it only to ask for an approver)."""

TAKES_OVER_LIMIT = 10
"""How many resource ids a run's plan keeps of those that take over objects."""


def takes_over(resource: Resource) -> str | None:
    """How ``resource`` takes over an existing object (for a line naming it), or None."""
    if resource.extensions.get("adopt"):
        return "adopts an existing object (extensions.adopt)"
    if resource.extensions.get(IMPORT_ID_KEY) not in (None, ""):
        return f"imports an existing object (extensions[{IMPORT_ID_KEY!r}])"
    return None


def taking_over(resources: Iterable[Resource]) -> list[tuple[str, str]]:
    """(id, how) of each resource that takes over an existing object, in spec order."""
    found = []
    for resource in resources:
        how = takes_over(resource)
        if how is not None:
            found.append((resource.id, how))
    return found
