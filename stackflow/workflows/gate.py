"""The gate an operation run passes between its preview and its walk, and where a paused run
waits: the policy gate (the run's policy bundles judge the masked plan), the approval wait
(``auto_approve`` unless a policy asks for a person, the project is four-eyes, or a git
commit's spec takes over objects) and, paused on failed nodes, the retry/abort decision.

A part the workflow holds (``OperationWorkflow._gate``), with what it decided: the policy
decision, the approval, the step a paused run was told. The workflow's update handlers
(:mod:`.steering`) hand it what a person said; the gate shows each wait through the
workflow's phase setter, handed to the wait. Thin and deterministic: the policy is evaluated
by an activity; the waits are timers on Updates.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.policy import PolicyActivities
    from stackflow.model.policy import Outcome, PolicyDecision
    from stackflow.model.release import Operation, Phase
    from stackflow.temporal.activity_io import PolicyInput
    from stackflow.temporal.operation import (
        NOT_AWAITING_APPROVAL,
        ApprovalInput,
        OperationInput,
        OperationPlan,
    )
    from stackflow.temporal.runtime_queues import parts
    from stackflow.workflows import common, patches
    from stackflow.workflows.constants import (
        APPROVER_DECIDES,
        AWAITING_APPROVAL,
        AWAITING_DECISION,
        LOCAL_SMALL_PREVIEW,
        POLICY_GATE,
    )

ShowWait = Callable[[Phase], Awaitable[None]]
"""The workflow's phase setter: how the gate shows (and announces) that the run waits."""


@dataclass
class Gate:
    """The policy gate and the waits for a person, and what they decided."""

    policy: PolicyDecision | None = None
    """What the run's policy bundles decided (None: no bundle judged the run)."""
    four_eyes: bool = False
    """The worker policy forbids the requester to approve this run."""
    takes_over: list[str] = field(default_factory=list)
    """Resources of a git commit's spec that adopt or import objects (plan.takes_over)."""
    decision: str | None = None
    """``approved``, ``rejected`` or ``timeout`` once the approval wait is over."""
    approval: dict[str, Any] | None = None
    """Who approved or rejected, why and when (recorded in the release)."""
    step: str | None = None
    """``retry`` or ``abort`` while a paused run is told what to do."""
    step_by: str | None = None

    # ---- the policy gate -------------------------------------------------------------------

    async def judge(
        self,
        request: OperationInput,
        operation: Operation,
        plan: OperationPlan,
        diff_refs: list[str],
    ) -> None:
        """Evaluate the run's policy bundles on the masked plan (when it has any, or when
        its input was asked for). The decision is kept for the view, the result and the
        release; a failure to evaluate fails the run like a failed preview."""
        if not (plan.policies or request.policy_input) or plan.plan_ref is None:
            return
        if not patches.patched(POLICY_GATE):
            return
        self.policy = await workflow.execute_activity_method(
            PolicyActivities.evaluate_policy,
            PolicyInput(
                project=request.project,
                workspace=request.workspace,
                operation=operation,
                revision=plan.revision,
                spec_ref=plan.spec_ref,
                plan_ref=plan.plan_ref,
                diff_refs=diff_refs,
                bundles=plan.policies,
                requested_by=request.operator,
                source=request.source,
                now=workflow.now().isoformat(),
            ),
            **common.store_call(f"evaluate {len(plan.policies)} policy bundles"),
        )

    def denial(self) -> str | None:
        """The line a denying policy ends the run with (None: not denied)."""
        if self.policy is None or self.policy.outcome != Outcome.denied:
            return None
        return self.policy.denial_line()

    # ---- the approval wait -----------------------------------------------------------------

    def local_preview(
        self, request: OperationInput, operation: Operation, plan: OperationPlan
    ) -> bool:
        """Whether an apply or destroy previews in a local activity (LOCAL_SMALL_PREVIEW):
        nothing can stop it between its preview and its walk (``auto_approve``, no policy
        bundle, which may ask for a person, no approver to wait for) and its preview is one
        small batch on the run's own task queue. The gate still judges the preview after."""
        return (
            operation in (Operation.apply, Operation.destroy)
            and request.auto_approve
            and not (plan.policies or request.policy_input)
            and max(plan.node_count, plan.deletion_count) <= common.LOCAL_PREVIEW_LIMIT
            and parts(plan.queues) == [(None, None)]
            and patches.patched(LOCAL_SMALL_PREVIEW)
            and not self.held_for_approver(request)
        )

    def held_for_approver(self, request: OperationInput) -> bool:
        """Whether ``auto_approve`` may not skip the wait: on a four-eyes project another
        person approves, whatever the client that started the run; a git commit's spec that
        adopts or imports objects (never read by the API) is approved by an approver. Runs
        started before APPROVER_DECIDES skip the wait as they did."""
        held = self.four_eyes or bool(self.takes_over and request.source is not None)
        return held and patches.patched(APPROVER_DECIDES)

    async def await_approval(self, request: OperationInput, show: ShowWait) -> bool:
        """Whether the run may go ahead: approved up front (``auto_approve``), or by a
        person before the approval timeout."""
        required = self.policy is not None and self.policy.outcome == Outcome.approval
        if request.auto_approve and not required and not self.held_for_approver(request):
            self.approval = {
                "decision": "approved",
                "by": f"{request.operator} (auto_approve)",
                "reason": None,
                "at": workflow.now().isoformat(),
            }
            return True
        await show(AWAITING_APPROVAL)
        try:
            await workflow.wait_condition(
                lambda: self.decision is not None,
                timeout=timedelta(seconds=request.approval_timeout_seconds),
            )
        except TimeoutError:
            self.decision = "timeout"
            self.approval = {
                "decision": "rejected",
                "by": "timeout",
                "reason": f"no approval within {request.approval_timeout_seconds:g}s",
                "at": workflow.now().isoformat(),
            }
        return self.decision == "approved"

    def rejection(self, operation: Operation) -> str:
        """The error line of a run whose approval wait ended rejected (or timed out)."""
        assert self.approval is not None
        reason = self.approval.get("reason")
        return f"{operation} rejected by {self.approval['by']}" + (f": {reason}" if reason else "")

    def check_awaiting(self, phase: Phase) -> None:
        """Refuse an approve or reject unless the run awaits one (``phase``: the run's)."""
        if phase != AWAITING_APPROVAL or self.decision is not None:
            raise ApplicationError(
                f"this run is not awaiting approval (phase {phase})",
                type=NOT_AWAITING_APPROVAL,
            )

    def check_approver(self, approval: ApprovalInput, requester: str | None) -> None:
        """Refuse the requester's own approval of a four-eyes run."""
        if self.four_eyes and approval.by == requester:
            raise ApplicationError(
                f"four-eyes: {approval.by} started this run and may not approve it; "
                "another approver must (worker policy STACKFLOW_FOUR_EYES)",
                type="FourEyes",
            )

    def decide(self, decision: str, approval: ApprovalInput) -> None:
        """A person approved or rejected. Validators of an approve and a reject in one
        activation both pass; only the first handler to run decides, the other update
        fails."""
        if self.decision is not None:
            raise ApplicationError(
                f"this run was already {self.decision}", type=NOT_AWAITING_APPROVAL
            )
        self.decision = decision
        self.approval = {
            "decision": decision,
            "by": approval.by,
            "reason": approval.reason,
            "at": workflow.now().isoformat(),
        }

    def approver(self) -> str | None:
        """Who approved the run, None before a decision or after a rejection."""
        approval = self.approval
        return str(approval["by"]) if approval and approval["decision"] == "approved" else None

    # ---- the retry/abort decision ----------------------------------------------------------

    async def await_decision(self, request: OperationInput, show: ShowWait) -> str:
        """Paused on failed nodes: wait for the retry or abort Update (abort on timeout)."""
        self.step = None
        await show(AWAITING_DECISION)
        try:
            await workflow.wait_condition(
                lambda: self.step is not None,
                timeout=timedelta(seconds=request.decision_timeout_seconds),
            )
        except TimeoutError:
            self.step, self.step_by = "abort", "timeout"
        assert self.step is not None
        return self.step

    def check_paused(self, phase: Phase) -> None:
        """Refuse a retry or abort unless the run is paused on failed nodes."""
        if phase != AWAITING_DECISION or self.step is not None:
            raise ApplicationError(
                f"this run is not paused on failed nodes (phase {phase})",
                type="NotAwaitingDecision",
            )

    def steer(self, step: str, request: ApprovalInput, phase: Phase) -> None:
        """A person said ``retry`` or ``abort``. Validators of two updates in one activation
        both pass: the handler decides."""
        self.check_paused(phase)
        self.step = step
        self.step_by = request.by
