"""One node of an operation's plan: a resource, what its activity does, what it waits for.

The whole plan (every node) is kept by the state backend's plan store and travels through
workflow history by reference (:mod:`stackflow.state.plan_store`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PlannedNode(BaseModel):
    id: str
    type: str
    action: str = "Apply"
    """Create, Update or Delete once the preview decided; what the node's activity does."""
    deps: list[str] = Field(default_factory=list)
    """Nodes that must succeed first (for deletes: the dependents of the original graph)."""
    refs: list[tuple[str, str]] = Field(default_factory=list)
    """(resource id, dotted path) of each ``$kusion_path`` reference in the attributes."""
    route: str | None = None
    """``<type>@<place glob>``: the node's activities go to that pinned task queue (a host
    pinned to a worker near it, :mod:`stackflow.temporal.runtime_queues`); None: its type's."""

    @property
    def route_key(self) -> str:
        """The key of the run's routing (``OperationPlan.queues``) for this node."""
        return self.route or self.type
