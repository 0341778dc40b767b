"""Models at the Temporal boundary: the workflows' inputs, plans, results and status (the
activities' own inputs and results are :mod:`stackflow.temporal.activity_io`).

These are the only types that travel through workflow history, so they stay small:
activities keep full live state in the release store and return summaries.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from stackflow.core.refs import RunRef, StackFields, StackRef
from stackflow.engine.selection import LeftOut
from stackflow.model.plan import PlannedNode
from stackflow.model.policy import BundleRef, PolicyDecision
from stackflow.model.release import Operation, Phase
from stackflow.model.source import SourceRef

TASK_QUEUE_DEFAULT = "stackflow"
BATCH_SIZE_DEFAULT = 1000
"""Nodes one workflow run walks itself; larger graphs go to one child workflow per batch,
one batch after another. Each boundary costs a child's start, its ``load_batch`` and the
wait for the batch's last group: a stack of up to a thousand resources walks in one run
(at 800, 1,000 OnPrem files took 6-8% longer as two batches); a child of 1,000 Kubernetes
nodes keeps its history near 230 KB."""
MAX_CONCURRENCY_DEFAULT = 16
"""Runtime calls in flight in a run that sets no ``max_concurrency`` (``--max-concurrency``):
about what peers use (Terraform's ``-parallelism`` 10, Argo CD's kubectl parallelism 20). A
group of ready nodes makes half of them at once (two groups overlap)."""
PLAN_INLINE_LIMIT = 1000
"""Plans up to this many nodes and deletions also travel inline in ``OperationPlan``."""
NOT_OK_LIMIT = 2000
"""Nodes of one walk that may fail or be skipped before the walk starts no further batch:
each batch's input names the earlier ones (its nodes' dependencies among them are skipped),
so past this the inputs would grow with the stack. The nodes not started are skipped, saying
why; a paused run's retry walks them again."""
DETAIL_LIMIT = 500
"""Per-field diffs and per-node results kept in workflow history, results, queries and the
release's ``changes``; beyond it only summaries (and what did not succeed) are kept, so a run
of 10,000+ resources stays far below Temporal's payload (2 MB) and history limits."""


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_LIMIT = 200
"""Characters of a project or workspace name at most (the state backend's columns; a
longer one would also be refused as a Temporal search attribute, failing workflow tasks)."""
WAIT_LIMIT = 10 * 365 * 86400.0
"""Longest approval or decision wait, in seconds (past it a timer cannot be made)."""
REVISION_LIMIT = 2**31 - 1
NOT_AWAITING_APPROVAL = "NotAwaitingApproval"
"""The error type of an approve or reject the run refuses because it does not await one
(it was decided already, or never waited)."""
"""Largest release revision (the state backend's integer columns)."""
Pattern = Annotated[str, StringConstraints(max_length=1000)]
"""A glob or a field path of an input (errors quote them: they stay short)."""


def workflow_id_for(stack: StackRef) -> str:
    """The default id: one operation per stack at a time."""
    return f"stackflow/{stack}"


def preview_workflow_id(stack: StackRef) -> str:
    """A preview's id: beside the stack's operation (a preview takes no lock)."""
    return workflow_id_for(stack) + "/preview"


def drift_workflow_id(stack: StackRef) -> str:
    """A drift check's id (its schedule's runs too)."""
    return workflow_id_for(stack) + "/drift"


class OperationInput(StackFields, BaseModel):
    """Input of PreviewWorkflow, ApplyWorkflow and DestroyWorkflow."""

    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN)
    workspace: str = Field(
        default="default", min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN
    )
    spec: dict[str, Any] | None = None
    """The Kusion v1 Spec: it travels with the run (compressed by the payload codec), so any
    Temporal client can start one; the first activity stores it in the state backend."""
    spec_ref: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    """A spec already in the state backend (``sha256:<hex>``), instead of ``spec``."""
    auto_approve: bool = False
    max_concurrency: int = Field(default=MAX_CONCURRENCY_DEFAULT, ge=1, le=500)
    ignore_fields: list[Pattern] = Field(default_factory=list, max_length=1000)
    watch: bool = False
    fail_fast: bool = False
    force: bool = False
    adopt: bool = False
    approval_timeout_seconds: float = Field(default=3600.0, gt=0, le=WAIT_LIMIT)
    batch_size: int = Field(default=BATCH_SIZE_DEFAULT, ge=1, le=1500)
    operator: str = Field(default="temporal", max_length=200)
    """Who started the run (recorded in the release); the CLI sets the user name."""
    unavailable_timeout_seconds: float = Field(default=600.0, gt=0, le=86400)
    """How long unreachable infrastructure is retried before its node fails saying so."""
    on_failure: Literal["fail", "pause"] = "fail"
    """``pause``: when nodes failed and nothing is left to run, wait (phase
    ``awaitingDecision``) for the ``retry`` or ``abort`` Update instead of failing."""
    decision_timeout_seconds: float = Field(default=3600.0, gt=0, le=WAIT_LIMIT)
    """How long a paused run waits for retry/abort before it aborts."""
    targets: list[Pattern] = Field(default_factory=list, max_length=100)
    """Glob patterns on resource ids: only these resources and what they depend on (for
    deletions: and what depends on them). See ``stackflow.engine.selection``."""
    excludes: list[Pattern] = Field(default_factory=list, max_length=100)
    """Glob patterns on resource ids: leave these out, and what depends on them (for
    deletions: and what they depend on)."""
    to_revision: int | None = Field(default=None, ge=1, le=REVISION_LIMIT)
    """RollbackWorkflow: the release whose spec to apply again (instead of spec/spec_ref)."""
    source: SourceRef | None = None
    """A spec file at an exact commit of a git repository (instead of spec/spec_ref): the
    worker fetches it, the release records it."""
    policy_ref: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    """A policy bundle already in the state backend (``stackflow policy`` or ``--policy
    DIR`` stored it) that this run evaluates besides its project's."""
    brief_result: bool = False
    """Return only the summary, the first changed resources (id, action) and what did not
    succeed: what a parent run (a stack set) keeps of each child in its own history."""
    set_run: str | None = Field(default=None, max_length=300)
    """The set run (``<set>/<run id>``) whose member this run is: the release records it."""
    policy_input: bool = False
    """Keep the policy input document even when no policy applies (``stackflow policy
    eval`` reads it by the decision's ``input_digest``)."""

    @model_validator(mode="after")
    def _one_spec_source(self) -> OperationInput:
        given = [self.spec is not None, self.spec_ref is not None, self.source is not None]
        if sum(given) > 1:
            raise ValueError("give one of spec, spec_ref and source, not more")
        return self

    @property
    def has_spec(self) -> bool:
        return self.spec is not None or self.spec_ref is not None or self.source is not None


def check_request(request: OperationInput) -> None:
    """What the model cannot check on its own; SpecError (exit 2, never retried) naming the
    option. The CLI calls it before starting a run and ``prepare_operation`` again for runs
    other clients start."""
    from stackflow.core.errors import SpecError
    from stackflow.core.paths import PathError, parse_path

    for path in request.ignore_fields:
        try:
            parse_path(path)
        except PathError as err:
            raise SpecError(
                f"ignore_fields: {err}; write dotted paths such as spec.replicas or "
                'metadata.labels["app.kubernetes.io/name"]'
            ) from None


class ApprovalInput(BaseModel):
    """Argument of the ``approve`` / ``reject`` workflow Updates."""

    by: str = "unknown"
    reason: str | None = None


class NodeStatus(StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    skipped = "skipped"


class NodeResult(BaseModel):
    """What one resource activity returns: a summary, never the live object."""

    id: str
    action: str
    status: NodeStatus
    digest: str | None = None
    error: str | None = None
    error_type: str | None = None
    """The failure's class (see ``OperationResult.error_type``)."""


class ChangeBrief(BaseModel):
    """One line of a preview as the workflow keeps it."""

    id: str
    type: str
    action: str
    drift: bool = False


GROUP_LIMIT = 64
"""Nodes one ``run_group`` activity takes at most, when its runtime's grouping sets no limit."""


class GroupSizing(BaseModel):
    """How a walk groups one runtime's ready nodes (from ``RuntimeRules.grouping``): at most
    ``limit`` nodes a group (None: GROUP_LIMIT), and with ``rounds`` at most that many per
    call of the group's share of the concurrency (None for both: about GROUP_ROUNDS rounds of
    its share)."""

    limit: int | None = Field(default=None, ge=1)
    rounds: int | None = Field(default=None, ge=1)


class OperationPlan(BaseModel):
    """What ``prepare_operation`` returns: the graph itself is stored by ``plan_ref``.

    The full plan (every node's deps and refs) grows with the spec, so it never travels
    through workflow history once it is large: activities and child workflows load the
    ranges they need from the plan store. Small plans also come inline (``inline``), which
    spares the walk of a small run one activity."""

    spec_ref: str | None
    plan_ref: str | None = None
    revision: int | None = None
    node_count: int = 0
    deletion_count: int = 0
    inline: bool = False
    """``nodes`` and ``deletions`` hold the whole plan (else they are empty)."""
    nodes: list[PlannedNode] = Field(default_factory=list)
    """Resources of the spec, in topological order."""
    deletions: list[PlannedNode] = Field(default_factory=list)
    """Resources of the prior state no longer in the spec, dependents first."""
    left_out: list[LeftOut] = Field(default_factory=list)
    """What ``targets``/``excludes`` left out, and why (the first LEFT_OUT_LIMIT)."""
    left_out_count: int = 0
    four_eyes: bool = False
    """The worker policy forbids the requester (``operator``) to approve this run."""
    takes_over: list[str] = Field(default_factory=list)  # a git commit's: stackflow.engine.takeover
    queues: dict[str, str] = Field(default_factory=dict)
    """Resource type -> the task queue of its runtime's activities (:mod:`stackflow.
    runtime_queues`; empty: every activity on the run's own queue)."""
    queue_wait_seconds: float = 300.0
    """How long a runtime activity waits for a worker of its queue."""
    grouping: dict[str, GroupSizing] = Field(default_factory=dict)
    """Resource type -> how the walk groups its ready nodes into ``run_group`` activities,
    for each type of the plan whose runtime is grouped (``RuntimeRules.grouped``, decided
    once here like :attr:`queues`); a type not in it runs one activity per node. Runs whose
    plan predates it group as the workflows' legacy constants say."""
    policies: list[BundleRef] = Field(default_factory=list, max_length=2)
    """The policy bundles the run evaluates between preview and apply (the project's, the
    run's own)."""


class DriftInput(StackFields, BaseModel):
    """Input of DriftWorkflow (``stackflow drift check`` and the drift Schedule)."""

    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN)
    workspace: str = Field(
        default="default", min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN
    )
    repair: bool = False
    """When drift is found, start an ApplyWorkflow of the last spec (normal approval rules
    unless ``auto_approve``)."""
    auto_approve: bool = False
    unavailable_timeout_seconds: float = Field(default=300.0, gt=0, le=86400)
    requested_by: str | None = Field(default=None, min_length=1, max_length=200)
    """Who asked for (or scheduled) the check: its repair's requester (None: drift-repair)."""


class DriftResult(StackFields, BaseModel):
    project: str
    workspace: str
    drifted: bool
    summary: dict[str, Any]
    """``DriftSummary`` as JSON: checked, drifted, missing, pending, ids (capped)."""
    revision: int | None = None
    report_ref: str | None = None
    repair_workflow_id: str | None = None
    repair_error: str | None = None
    checked_at: str


def references_entry(moved: str) -> dict[str, Any]:
    """The diff line of a node whose referenced field ``moved`` changes in this run."""
    return {"path": "(references)", "old": None, "new": f"(known after apply: {moved})"}


class StatusView(BaseModel):
    """Result of the ``status`` query."""

    phase: Phase
    revision: int | None = None
    total: int = 0
    done: int = 0
    failed: int = 0
    running: list[str] = Field(default_factory=list)
    changes: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    eta_seconds: float | None = None
    """Time left at the rate nodes finished so far in this walk (None before the first)."""
    approved_by: str | None = None
    """Who approved the run (``<operator> (auto_approve)`` when approved up front); None
    before a decision or after a rejection. The release records it when the run ends."""


class OperationResult(StackFields, BaseModel):
    """What an operation workflow returns (and the CLI prints)."""

    project: str
    workspace: str
    operation: Operation
    revision: int | None
    phase: Phase
    changes: dict[str, Any]
    results: list[NodeResult] = Field(default_factory=list)
    error: str | None = None
    error_type: str | None = None
    """The failure's class (activities.errors): InvalidInput, SpecError, NotFound, Conflict,
    Unreachable, InternalError, …, or Rejected / Aborted / Cancelled; the CLI's exit code."""
    counts: dict[str, int] = Field(default_factory=dict)
    """Node results by status (always complete)."""
    policy: PolicyDecision | None = None
    """What the policy gate decided (None: the run had no policies)."""
    truncated: bool = False
    """More than DETAIL_LIMIT nodes: ``results`` holds only the nodes that did not succeed and
    ``changes.changes`` only the first DETAIL_LIMIT changes, without diffs."""


class BatchInput(StackFields, BaseModel):
    """Input of the child workflow that walks one batch of a large graph."""

    project: str
    workspace: str
    revision: int
    spec_ref: str | None
    operation: str
    """``apply``, ``destroy`` (and ``delete`` for the deletions of an apply)."""
    plan_ref: str
    deletions: bool = False
    """Walk plan deletions (else plan nodes)."""
    start: int
    actions: str
    """The batch's action string (:class:`stackflow.temporal.wire.BatchActions`)."""
    not_ok: list[int] = Field(default_factory=list)
    """Plan indices that failed or were skipped in earlier batches."""
    owner: RunRef | None = None
    """The parent run: it holds the stack, the child's activities write on its behalf."""
    unavailable_timeout_seconds: float = 600.0
    full_results: bool = True
    """Return every result; else only counts, the first DETAIL_LIMIT results that did not
    succeed and the first failure."""
    max_concurrency: int = MAX_CONCURRENCY_DEFAULT
    fail_fast: bool = False
    watch: bool = False
    force: bool = False
    adopt: bool = False
    queues: dict[str, str] = Field(default_factory=dict)
    """The run's routing (``OperationPlan.queues``)."""
    grouping: dict[str, GroupSizing] = Field(default_factory=dict)
    """The run's grouping (``OperationPlan.grouping``)."""
    queue_wait_seconds: float = 300.0


class BatchResult(BaseModel):
    results: list[NodeResult] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    not_ok: list[int] = Field(default_factory=list)
    """Plan indices of the batch's nodes that did not succeed."""
    first_failed: NodeResult | None = None
