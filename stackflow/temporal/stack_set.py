"""SetWorkflow's models at the Temporal boundary: its input (a set and its members, each
with a spec inline, by ref or at a git commit), the plan ``prepare_set`` returns, what
``resolve_member`` takes and gives, and the set run's status and result.

Specs and the values references take never travel here: members' specs go to the state
backend by ref, resolved specs too; a member's line carries its phase, revision, counts
and a short error."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stackflow.core.refs import StackFields, StackRef
from stackflow.model.source import SourceRef
from stackflow.model.stack_set import BAKE_LIMIT, MEMBER_LIMIT, NAME, STACK, WAVE_LIMIT, Strategy
from stackflow.temporal.operation import (
    MAX_CONCURRENCY_DEFAULT,
    NAME_LIMIT,
    NAME_PATTERN,
    WAIT_LIMIT,
)

if TYPE_CHECKING:
    from stackflow.model.spec import Spec
    from stackflow.state.backend import StateBackend

SPEC_REF = r"^sha256:[0-9a-f]{64}$"
HISTORY_BUDGET = 2_000_000
"""Bytes of a set run's history past which it continues as new at its next step: a set of
MEMBER_LIMIT stacks keeps about 3 KB a stack per phase (a preview, an apply, each retry, a
rollback), so a long-paused set retried many times stays far under Temporal's limits."""
ERROR_LIMIT = 300
"""Characters of a member's error a status or result keeps."""
UNKNOWN_LIMIT = 10
"""References known only after apply that a member's line names (the count is complete),
each cut to ERROR_LIMIT characters: with MEMBER_LIMIT members a status stays under 1 MB."""


def set_workflow_id(name: str) -> str:
    """A set run's id: one run of a set at a time."""
    return f"stackflow-set/{name}"


class SetOperation(StrEnum):
    preview = "preview"
    apply = "apply"
    destroy = "destroy"


class MemberInput(StackFields, BaseModel):
    """One stack of the set: its spec (inline, by ref, or a git commit's file) and the
    stacks it runs after (references add the stacks they name)."""

    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN)
    workspace: str = Field(
        default="default", min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN
    )
    spec: dict[str, Any] | None = None
    spec_ref: str | None = Field(default=None, pattern=SPEC_REF)
    source: SourceRef | None = None
    depends_on: list[str] = Field(default_factory=list, max_length=MEMBER_LIMIT)
    context: dict[str, Any] = Field(default_factory=dict)
    """Merged over the spec's ``context`` (a target's own kube context, provider env)."""

    @model_validator(mode="after")
    def _one_spec(self) -> MemberInput:
        given = [self.spec is not None, self.spec_ref is not None, self.source is not None]
        if sum(given) > 1:
            raise ValueError("give one of spec, spec_ref and source, not more")
        for item in self.depends_on:
            if not re.match(STACK, item):
                raise ValueError(f"depends_on: {item[:80]!r} is not project/workspace")
        return self


class WaveInput(BaseModel):
    """One wave of a rollout (see :class:`stackflow.model.stack_set.Wave`)."""

    model_config = ConfigDict(extra="forbid")

    members: list[int] = Field(min_length=1, max_length=MEMBER_LIMIT)
    """Indices of ``SetInput.members``."""
    max_parallel: int = Field(default=4, ge=1, le=50)
    bake_seconds: float = Field(default=0.0, ge=0, le=BAKE_LIMIT)
    gate: Literal["none", "approval", "readiness", "policy"] = "none"


class SetInput(BaseModel):
    """Input of SetWorkflow."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=NAME)
    operation: SetOperation = SetOperation.apply
    members: list[MemberInput] = Field(min_length=1, max_length=MEMBER_LIMIT)
    auto_approve: bool = False
    """Apply: no set approval (a member's policy or four-eyes may still ask for one)."""
    max_parallel: int = Field(default=4, ge=1, le=50)
    """Member runs in flight at once."""
    on_failure: Literal["halt", "rollback", "pause"] = "halt"
    """After a member fails (its dependents are skipped, independent ones go on): ``halt``
    leaves what was applied; ``rollback`` returns each member this run changed to the
    release it had before, in reverse order; ``pause`` waits (``awaitingDecision``) for the
    ``retry`` Update (the failed and skipped members run again) or ``abort``."""
    decision_timeout_seconds: float = Field(default=3600.0, gt=0, le=WAIT_LIMIT)
    """How long a paused set waits for retry/abort before it aborts."""
    operator: str = Field(default="temporal", max_length=200)
    approval_timeout_seconds: float = Field(default=3600.0, gt=0, le=WAIT_LIMIT)
    max_concurrency: int = Field(default=MAX_CONCURRENCY_DEFAULT, ge=1, le=500)
    """Each member run's resources in flight."""
    waves: list[WaveInput] = Field(default_factory=list, max_length=WAVE_LIMIT)
    """An apply as a rollout: these waves in order (every member in one), each recorded
    and baked before the next starts. None: one pass in dependency order."""
    error_budget: int = Field(default=0, ge=0, le=MEMBER_LIMIT)
    """A rollout's failed stacks tolerated; one more halts it (no later stack starts)."""
    history_budget: int = Field(default=HISTORY_BUDGET, ge=0, le=HISTORY_BUDGET)
    """Bytes of history past which the set run continues as new at its next step (before
    its apply, a retry, its rollback), carrying what it knows in ``resume``."""
    resume: SetResume | None = None
    """Set by the set run itself when it continues as new: where it goes on."""

    @model_validator(mode="after")
    def _once(self) -> SetInput:
        names = [f"{m.project}/{m.workspace}" for m in self.members]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"members: {twice[0]} is named twice")
        if self.waves and self.on_failure == "pause":
            raise ValueError("on_failure: pause is for sets without waves (halt or rollback)")
        placed = sorted(i for wave in self.waves for i in wave.members)
        if self.waves and placed != list(range(len(self.members))):
            raise ValueError("waves: name every member (by index) in exactly one wave")
        needs_spec = self.operation != SetOperation.destroy
        for member in self.members:
            has = member.spec is not None or member.spec_ref or member.source
            if needs_spec and not has:
                raise ValueError(f"members: {member.stack} has no spec, spec_ref or source")
        return self


class PlannedMember(StackFields, BaseModel):
    """A member as ``prepare_set`` planned it."""

    project: str
    workspace: str
    spec_ref: str | None = None
    source: SourceRef | None = None
    deps: list[int] = Field(default_factory=list)
    """Members (indices) it runs after."""
    upstream: dict[int, list[str]] = Field(default_factory=dict)
    """Member index -> the resource ids of it this member's references read."""
    references: int = 0
    """``$stack.`` references of its spec (those to stacks outside the set included)."""
    before: int | None = None
    """The stack's latest succeeded release when the set run began (what rollback restores)."""
    four_eyes: bool = False
    """Its project is four-eyes: its run waits for an approver, whom the set's approval
    gives it (``forward_approval``)."""


class ForwardInput(BaseModel):
    """Give a member's run, once it waits for approval, the set's approval."""

    workflow_id: str
    run_id: str
    by: str
    reason: str | None = None
    wait_seconds: float


class SetPlan(BaseModel):
    members: list[PlannedMember]
    order: list[int]
    """Member indices in dependency order."""
    four_eyes: bool = False
    """A member's project is four-eyes: the set's requester may not approve the set."""


class ResolveInput(StackFields, BaseModel):
    """Resolve one member's references from what the stacks it reads recorded."""

    project: str
    workspace: str
    spec_ref: str
    changing: dict[str, list[str]] = Field(default_factory=dict)
    """Preview: stack -> resource ids an upstream change will produce anew (their values
    show as known after apply)."""


class ResolveResult(BaseModel):
    spec_ref: str
    """The resolved spec (the member's own when it has no references)."""
    resolved: int = 0
    unknown: list[str] = Field(default_factory=list)
    """References known only after apply (the first UNKNOWN_LIMIT)."""
    unknown_count: int = 0


class MemberPhase(StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    skipped = "skipped"
    rolled_back = "rolledBack"


class MemberView(StackFields, BaseModel):
    """One member's line of the set's status and result."""

    project: str
    workspace: str
    phase: MemberPhase = MemberPhase.pending
    revision: int | None = None
    before: int | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    """Node results by status (apply, destroy) or changes by action (preview)."""
    changed: bool = False
    """The member's run made a release that changed something (rollback's concern)."""
    unknown: list[str] = Field(default_factory=list)
    unknown_count: int = 0
    policy: str | None = None
    """What its latest preview's policy gate decided (``pass``, ``warn``,
    ``require_approval``, ``deny``; None: no policy judged it)."""
    workflow_id: str | None = None
    runs: list[str] = Field(default_factory=list)
    """Run ids of the stack's own runs in this set run (preview, apply, rollback; the last
    RUNS_KEPT): where its events are (``stackflow set events``)."""
    error: str | None = None
    error_type: str | None = None


RUNS_KEPT = 4


class SetView(BaseModel):
    """The ``status`` query and the set run's result."""

    name: str
    operation: SetOperation
    phase: str = "preparing"
    """preparing, previewing, awaitingApproval, applying, baking, destroying, rollingBack,
    succeeded, failed."""
    members: list[MemberView] = Field(default_factory=list)
    wave: int | None = None
    """A rollout's current wave (0 first)."""
    error: str | None = None
    error_type: str | None = None
    """``StackFailed`` when members failed (each says why); else the set run's own failure
    (``SpecError``, ``InvalidInput``: the set itself was refused, nothing ran)."""
    rolled_back: list[str] = Field(default_factory=list)
    """Stacks rollback returned to their earlier release (or destroyed: none before)."""


class SetResume(BaseModel):
    """What a set run continued as new goes on with: the step it was about to take, its plan
    and view (every member's line: bounded by MEMBER_LIMIT), the members whose apply it
    started (rollback's order) and the set's approval (given to four-eyes members)."""

    step: Literal["apply", "retry", "rollback"]
    plan: SetPlan
    view: SetView
    ran: list[int] = Field(default_factory=list)
    approval: dict[str, Any] | None = None


SetInput.model_rebuild()


class Member(NamedTuple):
    """A member as a client read it: its stack, what it depends on, its spec (None: none
    needed, or a git commit's file the worker reads)."""

    stack: StackRef
    depends_on: list[str]
    spec: Spec | None
    source: SourceRef | None = None
    context: dict[str, Any] | None = None


def checked_set_input(
    backend: StateBackend,
    name: str,
    operation: SetOperation,
    members: list[Member],
    strategy: Strategy | None = None,
    **options: Any,
) -> SetInput:
    """The set run's input as a client (the CLI, the API) makes it: the set checked whole as
    the worker will (references, order; SpecError naming what and where), each spec stored
    by ref (specs never travel in history)."""
    from stackflow.core.errors import SpecError
    from stackflow.engine.stack_set import check_set, check_waves, wave_members
    from stackflow.state.spec_store import SpecStore

    def recorded(stack: str) -> set[str] | None:
        ref = StackRef(*stack.split("/", 1))
        revision = backend.latest_succeeded_revision(ref)
        return None if revision is None else set(backend.resources(ref, revision))

    destroy = operation == SetOperation.destroy
    specs = [None if destroy else m.spec for m in members]
    names = [str(m.stack) for m in members]
    order, _ = check_set(name, names, specs, [m.depends_on for m in members], recorded)
    waves: list[WaveInput] = []
    if strategy is not None:
        found = wave_members(name, names, strategy)
        check_waves(name, names, order.deps, found)
        waves = [
            WaveInput(
                members=indices,
                max_parallel=wave.max_parallel,
                bake_seconds=wave.bake,
                gate=wave.gate,
            )
            for wave, indices in zip(strategy.waves, found, strict=True)
        ]
        options = {**options, "error_budget": strategy.error_budget}
    store = SpecStore(backend)
    try:
        return SetInput(
            name=name,
            operation=operation,
            members=[
                MemberInput(
                    project=m.stack.project,
                    workspace=m.stack.workspace,
                    depends_on=m.depends_on,
                    spec_ref=None if spec is None else store.put(spec),
                    source=None if destroy else m.source,
                    context=m.context or {},
                )
                for m, spec in zip(members, specs, strict=True)
            ],
            waves=waves,
            **options,
        )
    except ValueError as exc:
        raise SpecError(f"set {name}: {str(exc).splitlines()[-1].strip()}") from None
