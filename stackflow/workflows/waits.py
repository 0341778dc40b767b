"""The steps where an operation run waits or is judged: the policy gate (between preview
and approval), the approval wait (``auto_approve`` unless a policy asks for a person, the
project is four-eyes, or a git commit's spec takes over objects) and,
paused on failed nodes, the retry/abort decision. Thin and deterministic: the policy is
evaluated by an activity; the waits are timers on Updates (:mod:`.steering`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.policy import PolicyActivities
    from stackflow.model.policy import Outcome
    from stackflow.model.release import Phase
    from stackflow.temporal.activity_io import PolicyInput
    from stackflow.temporal.operation import OperationPlan
    from stackflow.workflows import common, patches
    from stackflow.workflows.constants import (
        APPROVER_DECIDES,
        AWAITING_APPROVAL,
        AWAITING_DECISION,
        POLICY_GATE,
    )
    from stackflow.workflows.nodes import Tally
    from stackflow.workflows.steering import SteeredRun


class GatedRun(SteeredRun):
    """The policy gate and the waits for a person, beside the state they change."""

    async def _set_phase(self, phase: Phase, **extra: Any) -> None:
        raise NotImplementedError  # OperationWorkflow's: persists the phase

    async def _policy_gate(self, plan: OperationPlan) -> None:
        """Evaluate the run's policy bundles on the masked plan (when it has any, or when
        its input was asked for). The decision is kept for the view, the result and the
        release; a failure to evaluate fails the run like a failed preview."""
        assert self._request is not None and self._lines is not None
        request = self._request
        if not (plan.policies or request.policy_input) or plan.plan_ref is None:
            return
        if not patches.patched(POLICY_GATE):
            return
        self._policy = await workflow.execute_activity_method(
            PolicyActivities.evaluate_policy,
            PolicyInput(
                project=request.project,
                workspace=request.workspace,
                operation=self.operation,
                revision=plan.revision,
                spec_ref=plan.spec_ref,
                plan_ref=plan.plan_ref,
                diff_refs=list(self._lines.diff_refs),
                bundles=plan.policies,
                requested_by=request.operator,
                source=request.source,
                now=workflow.now().isoformat(),
            ),
            **common.store_call(f"evaluate {len(plan.policies)} policy bundles"),
        )

    def _policy_denial(self) -> str | None:
        if self._policy is None or self._policy.outcome != Outcome.denied:
            return None
        return self._policy.denial_line()

    def _held_for_approver(self) -> bool:
        """Whether ``auto_approve`` may not skip the wait: on a four-eyes project another
        person approves, whatever the client that started the run; a git commit's spec that
        adopts or imports objects (never read by the API) is approved by an approver. Runs
        started before APPROVER_DECIDES skip the wait as they did."""
        assert self._request is not None
        held = self._four_eyes or bool(self._takes_over and self._request.source is not None)
        return held and patches.patched(APPROVER_DECIDES)

    async def _await_approval(self) -> bool:
        assert self._request is not None
        required = self._policy is not None and self._policy.outcome == Outcome.approval
        if self._request.auto_approve and not required and not self._held_for_approver():
            self._approval = {
                "decision": "approved",
                "by": f"{self._request.operator} (auto_approve)",
                "reason": None,
                "at": workflow.now().isoformat(),
            }
            return True
        await self._set_phase(AWAITING_APPROVAL)
        try:
            await workflow.wait_condition(
                lambda: self._decision is not None,
                timeout=timedelta(seconds=self._request.approval_timeout_seconds),
            )
        except TimeoutError:
            self._decision = "timeout"
            self._approval = {
                "decision": "rejected",
                "by": "timeout",
                "reason": f"no approval within {self._request.approval_timeout_seconds:g}s",
                "at": workflow.now().isoformat(),
            }
        return self._decision == "approved"

    async def _await_decision(self, tally: Tally) -> str:
        """Paused on failed nodes: wait for the retry or abort Update (abort on timeout)."""
        assert self._request is not None
        self._step = None
        await self._set_phase(AWAITING_DECISION)
        try:
            await workflow.wait_condition(
                lambda: self._step is not None,
                timeout=timedelta(seconds=self._request.decision_timeout_seconds),
            )
        except TimeoutError:
            self._step, self._step_by = "abort", "timeout"
        assert self._step is not None
        return self._step
