"""Inputs and results of the activities a run's workflows call (prepare, preview batches,
describe, load, node and group steps, policy, phase, events, drift records): what travels
through history between a workflow and its activities. They stay small: an activity reads
the spec and plan by reference from the state backend and returns summaries, never live
objects."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from stackflow.core.refs import RunRef, StackFields
from stackflow.model.events import NewEvent
from stackflow.model.plan import PlannedNode
from stackflow.model.policy import BundleRef, PolicyDecision
from stackflow.model.release import Operation, Phase
from stackflow.model.source import SourceRef
from stackflow.temporal.operation import (
    OperationInput,
)
from stackflow.temporal.wire import NOT_MINE, DescribeItem


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
