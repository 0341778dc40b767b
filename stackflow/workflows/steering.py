"""What an operation run shows and how it is steered: its state (phase, progress, preview
lines, failures, decisions), the Markdown the Temporal UI shows as its current details, the
``status`` and ``preview`` queries, and the ``approve``/``reject``/``retry``/``abort``
updates with their validators (they sit on the workflow class, as Temporal needs; what they
decide is kept by the run's :class:`~stackflow.workflows.gate.Gate`). Deterministic: no I/O;
the steps that change the state are in :mod:`stackflow.workflows.base`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from stackflow.core.terminal import human_duration, markdown_code, markdown_text
    from stackflow.model.events import NewEvent
    from stackflow.model.release import Operation, Phase
    from stackflow.temporal.operation import (
        ApprovalInput,
        ChangeBrief,
        NodeResult,
        OperationInput,
        StatusView,
    )
    from stackflow.workflows import common
    from stackflow.workflows.constants import AWAITING_APPROVAL, AWAITING_DECISION
    from stackflow.workflows.gate import Gate
    from stackflow.workflows.lines import PreviewLines, summarise
    from stackflow.workflows.walker import WalkProgress

WALKING = (Phase.applying, Phase.destroying)
"""Phases in which nodes are walked (progress and ETA are shown)."""


@dataclass
class NotOk:
    """Plan indices of the last walk that did not succeed: nodes and deletions."""

    nodes: list[int] = field(default_factory=list)
    deletions: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.deletions)


def approval_input(args: tuple[object, ...]) -> ApprovalInput:
    """The argument of approve/reject/retry/abort (none: ``ApprovalInput()``)."""
    return common.checked_input(ApprovalInput, args, what="update input", empty=ApprovalInput())


class Steered:
    """The ``approve``/``reject``/``retry``/``abort`` updates and their validators, shared by
    every run steered through a :class:`~stackflow.workflows.gate.Gate` (an operation run, a
    set run): approve/reject while awaiting approval, retry/abort while paused."""

    _gate: Gate
    _request: Any
    """What the run was asked (its ``operator`` requested it)."""

    def _steering_phase(self) -> Phase:
        """The run's phase as the gate's checks read it."""
        raise NotImplementedError

    # Update arguments come undecoded and are checked by the validators (and again by the
    # handlers, which replays run without validators): a malformed argument rejects the
    # update with one line, never the workflow task. No argument is ApprovalInput().
    @workflow.update
    async def approve(self, *args: object) -> str:
        approval = approval_input(args)
        self._gate.decide("approved", approval)
        return f"approved by {approval.by}"

    @approve.validator
    def _validate_approve(self, *args: object) -> None:
        approval = approval_input(args)
        self._gate.check_awaiting(self._steering_phase())
        requester = self._request.operator if self._request is not None else None
        self._gate.check_approver(approval, requester)

    @workflow.update
    async def reject(self, *args: object) -> str:
        approval = approval_input(args)
        self._gate.decide("rejected", approval)
        return f"rejected by {approval.by}"

    @reject.validator
    def _validate_reject(self, *args: object) -> None:
        approval_input(args)
        self._gate.check_awaiting(self._steering_phase())

    @workflow.update
    async def retry(self, *args: object) -> str:
        """A paused run re-runs what failed and what was skipped because of it."""
        request = approval_input(args)
        self._gate.steer("retry", request, self._steering_phase())
        return f"retry requested by {request.by}"

    @retry.validator
    def _validate_retry(self, *args: object) -> None:
        approval_input(args)
        self._gate.check_paused(self._steering_phase())

    @workflow.update
    async def abort(self, *args: object) -> str:
        """A paused run ends failed, as it is."""
        request = approval_input(args)
        self._gate.steer("abort", request, self._steering_phase())
        return f"abort requested by {request.by}"

    @abort.validator
    def _validate_abort(self, *args: object) -> None:
        approval_input(args)
        self._gate.check_paused(self._steering_phase())


class SteeredRun(Steered):
    """The state every operation run keeps, what the Temporal UI and ``status`` show of it,
    and the updates that steer it (approve/reject while awaiting approval, retry/abort while
    paused on failed nodes). The steps that change it are in :class:`OperationWorkflow`."""

    operation = Operation.apply

    def __init__(self) -> None:
        self._phase = Phase.generating
        self._revision: int | None = None
        self._total = 0
        self._progress = WalkProgress(self._tick)
        self._shown_done = 0
        self._lines: PreviewLines | None = None
        self._error: str | None = None
        self._request: OperationInput | None = None
        self._gate = Gate()
        """The policy gate and the waits for a person, with what they decided."""
        self._brief: tuple[object, object, dict[str, Any]] | None = None
        """The status query's changes, kept for the (settled) preview view and policy they
        were made from: a CLI asks for the status four times a second."""
        self._not_ok = NotOk()
        """Plan indices (nodes, deletions) of the last walk that did not succeed."""
        self._failures: list[NodeResult] = []
        self._error_type: str | None = None
        self._events: list[NewEvent] = []
        """Events for the run's stream held until the next activity that carries them."""
        self._no_worker: str | None = None
        """Why a runtime activity never started: no worker polls its queue."""
        self._held: list[SearchAttributeUpdate[Any]] = []
        """Search attributes held back to go out with the next upsert (the stack's, with the
        first phase: one visibility write instead of two)."""

    def _steering_phase(self) -> Phase:
        return self._phase

    def _attributes(self, *updates: SearchAttributeUpdate[Any]) -> None:
        """Upsert ``updates`` with any held back."""
        workflow.upsert_search_attributes([*self._held, *updates])
        self._held = []

    def _show(self) -> None:
        """What the Temporal UI shows for the run (Markdown, a few hundred bytes)."""
        request = self._request
        if request is None:
            return
        stack = request.stack
        lines = [f"**{self.operation} {stack}**: phase `{self._phase}`"]
        if self._revision is not None:
            lines[0] += f", release {self._revision}"
        if self._lines is not None:
            summary = self._lines.view()["summary"]
            lines.append(
                ", ".join(
                    f"{summary.get(a, 0)} {a.lower()}" for a in ("Create", "Update", "Delete")
                )
                + f", {summary.get('UnChanged', 0)} unchanged"
            )
        p = self._progress
        if self._total:
            line = f"{p.done}/{self._total} done, {p.failed} failed"
            eta = p.eta_seconds(workflow.now(), self._total)
            if eta and self._phase in WALKING:
                line += f", about {human_duration(eta)} left"
            lines.append(line)
        if p.running:
            more = f" and {len(p.running) - 5} more" if len(p.running) > 5 else ""
            lines.append("running: " + ", ".join(markdown_code(r) for r in p.running[:5]) + more)
        if self._failures:
            lines.append("failed:")
            lines += [
                f"- {markdown_code(r.id)}: {markdown_text((r.error or '')[:200])}"
                for r in self._failures[:5]
            ]
        flags = request.stack.cli_flags
        wid = workflow.info().workflow_id
        if self._phase == AWAITING_APPROVAL:
            lines.append(
                f"approve: `stackflow approve {flags}` or `temporal workflow update execute "
                f'--workflow-id {wid} --name approve --input \'{{"by":"you"}}\'` '
                f"(reject: `stackflow reject {flags}`)"
            )
        elif self._phase == AWAITING_DECISION:
            lines.append(
                f"retry the failed nodes: `stackflow retry {flags}` or `temporal workflow update "
                f'execute --workflow-id {wid} --name retry --input \'{{"by":"you"}}\'` '
                f"(give up: `stackflow abort {flags}`)"
            )
        if self._error:
            lines.append(f"error: {markdown_text(self._error[:300])}")
        workflow.set_current_details("\n\n".join(lines))

    def _tick(self) -> None:
        """Nodes finished: refresh the UI's current details every ~5% of the walk."""
        step = max(1, self._total // 20)
        if self._progress.done - self._shown_done >= step:
            self._shown_done = self._progress.done
            self._show()

    def _changes_view(self) -> dict[str, Any]:
        view = summarise([]) if self._lines is None else self._lines.view()
        policy = self._gate.policy
        if policy is not None:
            view["policy"] = policy.model_dump(mode="json", exclude_none=True)
        return view

    # ---- queries & updates ----------------------------------------------------------------
    def _brief_changes(self) -> dict[str, Any]:
        """Each shown change as a ChangeBrief's fields, and the summary."""
        view = summarise([]) if self._lines is None else self._lines.view()
        kept = self._brief
        if kept is not None and kept[0] is view and kept[1] is self._gate.policy:
            return kept[2]
        brief = self._changes_view()
        briefs = [
            ChangeBrief(id=c["id"], type=c["type"], action=c["action"], drift=c.get("drift", False))
            for c in brief["changes"]
        ]
        changes = {"changes": [b.model_dump() for b in briefs], "summary": brief["summary"]}
        if self._lines is not None:
            self._brief = (view, self._gate.policy, changes)
        return changes

    @workflow.query
    def status(self) -> StatusView:
        return StatusView(
            phase=self._phase,
            revision=self._revision,
            total=self._total,
            done=self._progress.done,
            failed=self._progress.failed,
            running=list(self._progress.running),
            changes=self._brief_changes(),
            error=self._error,
            eta_seconds=self._progress.eta_seconds(workflow.now(), self._total)
            if self._phase in WALKING
            else None,
            approved_by=self._gate.approver(),
        )

    @workflow.query
    def preview(self) -> dict[str, Any]:
        """The preview (with per-field diffs) once it is computed (capped at DETAIL_LIMIT)."""
        return self._changes_view()
