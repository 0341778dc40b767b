"""Releases: one per revision of a stack (project/workspace), with Kusion's fields.

They are stored by the state backend (:mod:`stackflow.state.backend`), which also holds the
stack lock and writes each resource's state as its node finishes.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from stackflow.core.refs import StackRef
from stackflow.model.policy import PolicyDecision
from stackflow.model.source import SourceRef
from stackflow.model.spec import Resource, Spec


class Operation(StrEnum):
    """Every operation stackflow runs (one workflow each). The first four make a release;
    ``preview`` and ``drift`` read only."""

    apply = "apply"
    destroy = "destroy"
    rollback = "rollback"
    """An apply of an earlier release's spec (``source_revision``)."""
    refresh = "refresh"
    """Live state recorded as it is; infrastructure untouched."""
    preview = "preview"
    """What an apply would change (no release, no lock)."""
    drift = "drift"
    """The last spec and the recorded state against what is live (no release, no lock)."""

    @property
    def makes_release(self) -> bool:
        return self not in (Operation.preview, Operation.drift)


class Phase(StrEnum):
    """A run's phase: Kusion's release phases, and the two waits of a run (never stored in
    a release, whose phase stays ``previewing`` or ``applying``/``destroying`` meanwhile)."""

    generating = "generating"
    previewing = "previewing"
    awaitingApproval = "awaitingApproval"
    applying = "applying"
    awaitingDecision = "awaitingDecision"
    destroying = "destroying"
    succeeded = "succeeded"
    failed = "failed"

    @property
    def is_final(self) -> bool:
        return self in (Phase.succeeded, Phase.failed)

    @property
    def is_walking(self) -> bool:
        return self in (Phase.applying, Phase.destroying)

    @property
    def is_stored(self) -> bool:
        """Whether a release records this phase (a run's waits are not)."""
        return self not in (Phase.awaitingApproval, Phase.awaitingDecision)


class Decision(StrEnum):
    approved = "approved"
    rejected = "rejected"


class Approval(BaseModel):
    decision: Decision
    by: str
    at: datetime
    reason: str | None = None


class State(BaseModel):
    """Resources as applied, with their live attributes."""

    model_config = ConfigDict(extra="ignore")

    resources: list[Resource] = Field(default_factory=list)

    def by_id(self) -> dict[str, Resource]:
        return {r.id: r for r in self.resources}


class Release(BaseModel):
    """A release; reads Kusion's files too (``createTime``, ``modifiedTime``, ``stack``)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    project: str
    workspace: str
    revision: int
    stack: str | None = None
    operation: Operation = Operation.apply  # Kusion's releases have none: they were applies
    phase: Phase
    spec: Spec | None = None
    state: State = Field(default_factory=State)
    error: str | None = None
    approval: Approval | None = None
    changes: dict[str, Any] | None = None
    workflow_id: str | None = None
    """The Temporal workflow that runs this release (None for imported/Kusion releases)."""
    run_id: str | None = None
    source_revision: int | None = None
    """For a rollback: the revision whose spec it applied."""
    source: SourceRef | None = None
    """For a run of a git source: the repository, commit and file it applied."""
    set_run: str | None = None
    """The set run (``<set>/<run id>``) that made it, when a stack set's member run did."""
    policy: PolicyDecision | None = None
    """What the policy gate decided before the run changed anything (None: no policies)."""
    spec_ref: str | None = Field(default=None, exclude=True)
    """Where the backend keeps the spec (content-addressed); not part of Kusion's format."""
    resource_count: int | None = Field(default=None, exclude=True)
    """Set instead of ``state`` by listings that do not load the state."""
    created_at: datetime = Field(validation_alias=AliasChoices("created_at", "createTime"))
    modified_at: datetime = Field(validation_alias=AliasChoices("modified_at", "modifiedTime"))

    @property
    def stack_ref(self) -> StackRef:
        """The release's stack (``stack`` is Kusion's stack name, a field of its format)."""
        return StackRef(self.project, self.workspace)


class Unlocked(BaseModel):
    """What freeing a stack by hand did (``stackflow release unlock``, ``POST
    /v1/stacks/{project}/{workspace}/unlock``): ``unlocked`` False when it was not locked;
    ``revision`` and ``phase`` are its latest release's afterwards."""

    project: str
    workspace: str
    unlocked: bool
    revision: int
    phase: Phase
    reason: str | None = None
    """What the freed release's error now says."""

    def line(self) -> str:
        """The line the CLI prints."""
        stack = StackRef(self.project, self.workspace)
        if not self.unlocked:
            return f"stack {stack} is not locked (release {self.revision} is {self.phase})"
        return f"unlocked {stack}: release {self.revision} is now {self.phase}"
