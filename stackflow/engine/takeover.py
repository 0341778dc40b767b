"""Resources of a spec that take over objects stackflow did not make: each runtime's rules say
which of its resources do (:meth:`stackflow.model.runtime_rules.RuntimeRules.takes_over`: a
Kubernetes object adopted with ``extensions.adopt: true``, a Terraform object imported with
``extensions["kusionstack.io/import-id"]``). Taking over an object that another team runs is
an approver's decision: the API refuses such a run from an operator, and a run of a git commit
(whose spec the API never sees) that takes over anything waits for an approver whatever its
``auto_approve`` (:mod:`stackflow.workflows.gate`).
"""

from __future__ import annotations

from collections.abc import Iterable

from stackflow.model.runtime_rules import rules_for
from stackflow.model.spec import Resource

TAKES_OVER_LIMIT = 10
"""How many resource ids a run's plan keeps of those that take over objects."""


def takes_over(resource: Resource) -> str | None:
    """How ``resource`` takes over an existing object (for a line naming it), or None."""
    rules = rules_for(resource.type)
    return rules.takes_over(resource.extensions) if rules is not None else None


def taking_over(resources: Iterable[Resource]) -> list[tuple[str, str]]:
    """(id, how) of each resource that takes over an existing object, in spec order."""
    found = []
    for resource in resources:
        how = takes_over(resource)
        if how is not None:
            found.append((resource.id, how))
    return found
