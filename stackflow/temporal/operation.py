"""Models at the Temporal boundary: workflow inputs, activity inputs/results, status.

These are the only types that travel through workflow history, so they stay small:
activities keep full live state in the release store and return summaries.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from stackflow.core.refs import RunRef, StackFields, StackRef
from stackflow.engine.selection import LeftOut
from stackflow.model.events import NewEvent
from stackflow.model.plan import PlannedNode
from stackflow.model.policy import BundleRef, PolicyDecision
from stackflow.model.release import Operation, Phase
from stackflow.model.source import SourceRef
from stackflow.temporal.wire import NOT_MINE, DescribeItem

TASK_QUEUE_DEFAULT = "stackflow"
BATCH_SIZE_DEFAULT = 800
"""Nodes one workflow run walks itself; larger graphs go to one child workflow per batch."""
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


def human_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h10m``: how the CLI and the UI show an ETA."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_LIMIT = 200
"""Characters of a project or workspace name at most (the state backend's columns; a
longer one would also be refused as a Temporal search attribute, failing workflow tasks)."""
WAIT_LIMIT = 10 * 365 * 86400.0
"""Longest approval or decision wait, in seconds (past it a timer cannot be made)."""
REVISION_LIMIT = 2**31 - 1
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
    max_concurrency: int = Field(default=8, ge=1, le=500)
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


class PrepareInput(BaseModel):
    """Input of the ``prepare_operation`` activity."""

    operation: Operation
    request: OperationInput
    workflow_id: str
    run_id: str


class PreviewBatchInput(StackFields, BaseModel):
    """One preview activity: plan nodes ``[start, end)`` and plan deletions ``[start, end)``."""

    project: str
    workspace: str
    spec_ref: str | None
    revision: int | None
    plan_ref: str
    start: int
    end: int
    ignore_fields: list[str] = Field(default_factory=list)
    force: bool = False
    adopt: bool = False
    unavailable_timeout_seconds: float = 600.0
    with_diff: bool = True
    """Return the full changes with per-field diffs (``details``); False past DETAIL_LIMIT,
    where only ``codes`` come back (such a change shows ``diff: []`` and, when it had a
    diff, ``diff_omitted: true``)."""
    runtimes: list[str] | None = None
    """Only the resources of these types (a runtime's queue); the other lines of the range
    come back as :data:`stackflow.temporal.wire.NOT_MINE` for the runtime that has them."""


class RefreshBatchInput(PreviewBatchInput):
    """One refresh activity over plan nodes ``[start, end)`` (the recorded resources):
    read each, diff it against its recorded state; with ``record``, write what changed."""

    record: bool = False


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


class DiffIndexInput(BaseModel):
    """Input of ``index_diffs``: diff refs (at most a few dozen) to fold into one."""

    refs: list[str]


class DriftRecordInput(StackFields, BaseModel):
    """Input of ``record_drift``: the counts, and the refs of the preview's full diffs (one
    per 200 resources, folded into indexes past a few) from which the activity keeps the
    drifted ones."""

    project: str
    workspace: str
    revision: int | None
    checked_at: str
    """ISO time (the workflow's clock)."""
    summary: dict[str, Any]
    diff_refs: list[str] = Field(default_factory=list)
    workflow_id: str
    run_id: str
    repair_workflow_id: str | None = None


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


class PreviewBatchResult(BaseModel):
    """A preview batch, compact: 30,000 changes cost the parent history ~2 bytes each."""

    diff_ref: str | None = None
    """The batch's full changes (every field, whole values) in the state backend, when they
    had diffs: what ``details`` shortens to stay within the byte budget."""
    codes: str = ""
    """Two characters per change (the range's nodes, then its deletions): a change code
    (:func:`stackflow.temporal.wire.encode_change`)."""
    details: list[dict[str, Any]] = Field(default_factory=list)
    """The full changes, same order (only when ``with_diff``)."""
    refs: list[tuple[int, int, str]] = Field(default_factory=list)
    """(node index, referenced node index, dotted path) of each ``$kusion_path`` reference
    of the UnChanged nodes, in the node's ``refs`` order: what settling references needs."""
    more_diff_refs: list[str] = Field(default_factory=list)
    """Diff refs of the other runtimes' parts of a range (``merge``)."""

    def spread(self, positions: list[int], total: int) -> PreviewBatchResult:
        """This runtime's lines at their ``positions`` among the range's ``total`` lines;
        the others :data:`~stackflow.temporal.wire.NOT_MINE` (a runtime queue's part of a range)."""
        codes = [NOT_MINE] * total
        details: list[dict[str, Any]] = [{} for _ in range(total)] if self.details else []
        for n, position in enumerate(positions):
            codes[position] = self.codes[2 * n : 2 * n + 2]
            if self.details:
                details[position] = self.details[n]
        return self.model_copy(update={"codes": "".join(codes), "details": details})

    @classmethod
    def merge(cls, parts: list[PreviewBatchResult]) -> PreviewBatchResult:
        """One range's result from its runtimes' parts (each line answered by exactly one;
        ValueError otherwise)."""
        if len(parts) == 1:
            return parts[0]
        total = len(parts[0].codes) // 2
        codes: list[str] = []
        details: list[dict[str, Any]] = []
        with_details = any(p.details for p in parts)
        for line in range(total):
            owners = [p for p in parts if p.codes[2 * line : 2 * line + 2] != NOT_MINE]
            if len(owners) != 1:
                raise ValueError(f"line {line} of the range answered by {len(owners)} runtimes")
            codes.append(owners[0].codes[2 * line : 2 * line + 2])
            if with_details:
                details.append(owners[0].details[line] if owners[0].details else {})
        refs = sorted((r for p in parts for r in p.refs), key=lambda r: r[0])  # stable
        diff_refs = [p.diff_ref for p in parts if p.diff_ref]
        return cls(
            diff_ref=diff_refs[0] if diff_refs else None,
            more_diff_refs=diff_refs[1:],
            codes="".join(codes),
            details=details,
            refs=refs,
        )


class DescribeInput(BaseModel):
    """Full (diff-less) changes for preview lines the parent holds only as codes."""

    plan_ref: str
    items: list[DescribeItem]
    """The lines to describe (:class:`stackflow.temporal.wire.DescribeItem`, a list on the wire)."""


class LoadBatchInput(BaseModel):
    """Nodes of one walk batch, read from the plan store."""

    plan_ref: str
    deletions: bool = False
    start: int
    actions: str
    """The batch's action string (:class:`stackflow.temporal.wire.BatchActions`)."""
    not_ok: list[int] = Field(default_factory=list)
    """Plan indices (same list) that did not succeed in earlier batches."""


class LoadedBatch(BaseModel):
    nodes: list[PlannedNode]
    """With their actions set and without refs."""
    blocked: list[str] = Field(default_factory=list)
    """Dependencies of these nodes among ``not_ok``."""


def references_entry(moved: str) -> dict[str, Any]:
    """The diff line of a node whose referenced field ``moved`` changes in this run."""
    return {"path": "(references)", "old": None, "new": f"(known after apply: {moved})"}


class PolicyInput(StackFields, BaseModel):
    """Input of ``evaluate_policy``: what the input document is built from (by reference)
    and the bundles to evaluate."""

    project: str
    workspace: str
    operation: Operation
    revision: int | None
    spec_ref: str | None
    plan_ref: str
    diff_refs: list[str] = Field(default_factory=list, max_length=64)
    bundles: list[BundleRef] = Field(default_factory=list, max_length=2)
    requested_by: str
    source: SourceRef | None = None
    now: str
    """The run's clock (the workflow's): the input's ``time``."""


class PhaseInput(StackFields, BaseModel):
    project: str
    workspace: str
    revision: int
    phase: Phase
    error: str | None = None
    changes: dict[str, Any] | None = None
    approval: dict[str, Any] | None = None
    counts: dict[str, int] | None = None
    """A final phase: how many nodes ended how (the ``run_complete`` event says it)."""
    policy: PolicyDecision | None = None
    """What the policy gate decided (recorded in the release)."""
    events: list[NewEvent] = Field(default_factory=list, max_length=4)
    """Events the workflow saw first (``change_summary``): appended before the phase's."""


class EventsInput(StackFields, BaseModel):
    """Input of ``append_events``: what only the workflow knows (a few small events)."""

    project: str
    workspace: str
    events: list[NewEvent] = Field(max_length=4)


class NodeInput(StackFields, BaseModel):
    """Input of ``apply_resource`` / ``delete_resource``: names the node, carries no state."""

    project: str
    workspace: str
    revision: int
    spec_ref: str | None
    resource_id: str
    action: str
    watch: bool = False
    force: bool = False
    adopt: bool = False
    owner: RunRef | None = None
    """The run that holds the stack, when not the run calling (a batch child's parent)."""
    unavailable_timeout_seconds: float = 600.0


class GroupInput(StackFields, BaseModel):
    """Input of ``run_group``: several ready nodes of cheap runtimes in one activity (each
    still applied or deleted on its own, with its own result)."""

    project: str
    workspace: str
    revision: int
    spec_ref: str | None
    nodes: list[tuple[str, str]]
    """(resource id, action) of each node."""
    concurrency: int = Field(default=8, ge=1)
    """Runtime calls this group makes at once (its share of the run's max_concurrency)."""
    force: bool = False
    adopt: bool = False
    owner: RunRef | None = None
    unavailable_timeout_seconds: float = 600.0


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
    max_concurrency: int = 8
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
