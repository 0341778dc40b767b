"""SetWorkflow: many stacks as one run. Each member runs as a child workflow of the stack's
own kind (PreviewWorkflow, ApplyWorkflow, DestroyWorkflow) under the stack's usual id, in
dependency order (destroy: dependents first), at most ``max_parallel`` at a time; a member
whose dependency failed or was skipped is skipped.

Before a member that reads other stacks (``$stack.`` references) starts, ``resolve_member``
resolves them from what those stacks just recorded and stores the resolved spec by ref; in
a preview, a value an upstream change will produce is ``(known after apply)``. An apply
previews the set first and waits for one approval (unless ``auto_approve``), then applies
each member approved up front (a member's policy or four-eyes may still hold it).

Locks: a member's child holds its stack's lock as any run does, under the stack's id. A
member whose stack is busy (another run holds the id) fails at once naming it; nothing
waits for a lock, so two set runs sharing stacks never deadlock: the later one fails that
member (its dependents are skipped) and ends. ``on_failure: rollback`` then returns each
member this run changed to the release it had before (RollbackWorkflow; DestroyWorkflow
when it had none), in reverse order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.stack_set import SetActivities
    from stackflow.core.terminal import markdown_code, markdown_text
    from stackflow.model.release import Phase
    from stackflow.temporal.operation import (
        OperationInput,
        OperationResult,
        preview_workflow_id,
        workflow_id_for,
    )
    from stackflow.temporal.stack_set import (
        ERROR_LIMIT,
        RUNS_KEPT,
        ForwardInput,
        MemberPhase,
        MemberView,
        ResolveInput,
        ResolveResult,
        SetInput,
        SetOperation,
        SetPlan,
        SetResume,
        SetView,
    )
    from stackflow.workflows import common
    from stackflow.workflows.constants import SET_CONTINUE_AS_NEW, SET_RUN_ON_RELEASES
    from stackflow.workflows.gate import Gate
    from stackflow.workflows.nodes import cause_type, failure_message, raise_if_cancelled
    from stackflow.workflows.patches import patched
    from stackflow.workflows.set_waves import NOT_OK, SetWaves
    from stackflow.workflows.steering import Steered

WORKFLOWS = {
    SetOperation.preview: "PreviewWorkflow",
    SetOperation.apply: "ApplyWorkflow",
    SetOperation.destroy: "DestroyWorkflow",
}
DETAIL_MEMBERS = 50
"""Stacks the UI's current details name (then the status query has them all)."""
BAD_INPUT = ("InvalidInput", "SpecError", "NotFound", "PolicyDenied")


def _short(text: str | None) -> str | None:
    return None if text is None else text[:ERROR_LIMIT]


@workflow.defn(name="SetWorkflow")
class SetWorkflow(Steered, SetWaves):
    def __init__(self) -> None:
        self._view: SetView | None = None
        self._request: SetInput | None = None
        self._gate = Gate()
        self._ran: list[int] = []
        """Members whose apply started, in order (rollback goes back in reverse)."""
        self._changing: dict[int, list[str]] = {}
        """Preview: member -> the resource ids (that others read) its change produces anew."""

    # ---- the run ---------------------------------------------------------------------------
    @workflow.run
    async def run(self, *args: object) -> SetView:
        try:
            request = common.checked_input(SetInput, args)
        except ApplicationError as err:
            self._view = SetView(
                name="?", operation=SetOperation.apply, phase="failed", error=err.message
            )
            raise
        self._request = request
        if request.resume is not None:  # continued as new: go on where the run before was
            resume = request.resume
            self._view, self._ran, self._gate.approval = resume.view, resume.ran, resume.approval
            self._gate.four_eyes = resume.plan.four_eyes
            return await self._apply(resume.plan, request, resume.step)
        view = self._view = SetView(
            name=request.name,
            operation=request.operation,
            members=[MemberView(project=m.project, workspace=m.workspace) for m in request.members],
        )
        try:
            plan = await workflow.execute_activity_method(
                SetActivities.prepare_set,
                request,
                **common.store_call(f"prepare set {request.name}"),
            )
        except ActivityError as exc:
            raise_if_cancelled(exc)
            return self._fail(failure_message(exc), cause_type(exc))
        for member, planned in zip(view.members, plan.members, strict=True):
            member.before = planned.before
        self._gate.four_eyes = plan.four_eyes
        operation = request.operation
        if operation == SetOperation.destroy:
            dependents: list[list[int]] = [[] for _ in plan.members]
            for i, member in enumerate(plan.members):
                for d in member.deps:
                    dependents[d].append(i)
            if not request.auto_approve and not await self._approved(request):
                return self._rejected()
            view.phase = Phase.destroying
            await self._walk(plan, SetOperation.destroy, list(reversed(plan.order)), dependents)
            return self._end()
        deps = [m.deps for m in plan.members]
        if operation == SetOperation.preview or not request.auto_approve:
            view.phase = Phase.previewing
            await self._walk(plan, SetOperation.preview, plan.order, deps)
            if operation == SetOperation.preview or self._failed():
                return self._end()
            if not any(self._changes(m) for m in view.members):
                return self._end()
            if not await self._approved(request):
                return self._rejected()
            view.members = [
                MemberView(project=m.project, workspace=m.workspace, before=m.before, runs=m.runs)
                for m in view.members
            ]
        await self._continue_if_long(plan, "apply")
        return await self._apply(plan, request, "apply")

    async def _apply(self, plan: SetPlan, request: SetInput, step: str) -> SetView:
        """The set's apply from ``step`` on (``apply``; ``retry``: a retry was asked for;
        ``rollback``), then its pauses and rollback as ``on_failure`` says."""
        assert self._view is not None
        view, deps = self._view, [m.deps for m in plan.members]
        if step == "apply":
            view.phase = Phase.applying
            if request.waves:
                await self._rollout(plan, request, deps)
            else:
                await self._walk(plan, SetOperation.apply, plan.order, deps)
        retrying = step == "retry"
        while step != "rollback" and self._failed() and request.on_failure == "pause":
            if not retrying and await self._decision(request) != "retry":
                by = self._gate.step_by
                view.error, view.error_type = f"set apply aborted by {by}", "Aborted"
                break
            if not retrying:
                await self._continue_if_long(plan, "retry")
            retrying = False
            again = [i for i in plan.order if view.members[i].phase in NOT_OK]
            for i in again:
                was = view.members[i]
                view.members[i] = MemberView(
                    project=was.project, workspace=was.workspace, before=was.before, runs=was.runs
                )
            view.phase = Phase.applying
            await self._walk(plan, SetOperation.apply, again, deps)
        if self._failed() and request.on_failure == "rollback":
            if step != "rollback":
                await self._continue_if_long(plan, "rollback")
            await self._roll_back()
        return self._end()

    async def _continue_if_long(self, plan: SetPlan, step: str) -> None:
        """Past the history budget, continue as new at ``step`` with what this run knows
        (between steps: no member run is in flight)."""
        assert self._request is not None and self._view is not None
        info = workflow.info()
        long = info.get_current_history_size() > self._request.history_budget
        if not (long or info.is_continue_as_new_suggested()):
            return
        if not patched(SET_CONTINUE_AS_NEW):
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        resume = SetResume.model_validate(
            {
                "step": step,
                "plan": plan,
                "view": self._view,
                "ran": self._ran,
                "approval": self._gate.approval,
            }
        )
        self._show()
        workflow.continue_as_new(self._request.model_copy(update={"resume": resume}))

    async def _decision(self, request: SetInput) -> str:
        """Paused on failed stacks: the retry or abort Update (abort on timeout)."""
        assert self._view is not None
        self._gate.step = None
        self._view.phase = Phase.awaitingDecision
        self._show()
        try:
            await workflow.wait_condition(
                lambda: self._gate.step is not None,
                timeout=timedelta(seconds=request.decision_timeout_seconds),
            )
        except TimeoutError:
            self._gate.step, self._gate.step_by = "abort", "timeout"
        assert self._gate.step is not None
        return self._gate.step

    def _fail(self, error: str, error_type: str | None) -> SetView:
        assert self._view is not None
        self._view.phase = Phase.failed
        self._view.error = _short(error)
        self._view.error_type = error_type
        if error_type in BAD_INPUT:
            # bad input fails the run (not its workflow task), saying what and where
            raise ApplicationError(self._view.error or error, type=error_type, non_retryable=True)
        return self._view

    def _rejected(self) -> SetView:
        assert self._gate.approval is not None and self._request is not None
        who, why = self._gate.approval["by"], self._gate.approval.get("reason")
        line = f"set {self._request.operation} rejected by {who}" + (f": {why}" if why else "")
        return self._fail(line, "Rejected")

    def _failed(self) -> list[MemberView]:
        assert self._view is not None
        return [m for m in self._view.members if m.phase == MemberPhase.failed]

    @staticmethod
    def _changes(member: MemberView) -> bool:
        return any(n for action, n in member.counts.items() if action != "UnChanged")

    def _end(self) -> SetView:
        assert self._view is not None
        failed = self._failed()
        if failed and self._view.error is None:
            first = failed[0]
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            self._view.error = _short(f"{first.stack}: {first.error}{more}")
            # members refused as bad input, before anything changed: the set's input was bad
            bad = all(m.error_type in BAD_INPUT for m in failed)
            changed = any(m.changed for m in self._view.members)
            self._view.error_type = first.error_type if bad and not changed else "StackFailed"
        self._view.phase = Phase.failed if self._view.error else Phase.succeeded
        self._show()
        return self._view

    async def _approved(self, request: SetInput) -> bool:
        """One approval for the set (the gate's decision, as a stack run's)."""
        assert self._view is not None
        self._view.phase = Phase.awaitingApproval
        self._show()
        try:
            await workflow.wait_condition(
                lambda: self._gate.decision is not None,
                timeout=timedelta(seconds=request.approval_timeout_seconds),
            )
        except TimeoutError:
            self._gate.decision = "timeout"
            self._gate.approval = {"decision": "rejected", "by": "timeout", "reason": None}
        return self._gate.decision == "approved"

    # ---- the walk over members -------------------------------------------------------------
    async def _walk(
        self,
        plan: SetPlan,
        kind: SetOperation,
        order: list[int],
        deps: list[list[int]],
        parallel: int | None = None,
        watch: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Start each member once what it follows succeeded (at most ``parallel``, else
        max_parallel, at once); skip it when one of those failed or was skipped, or once
        ``stop`` says so."""
        assert self._view is not None and self._request is not None
        members = self._view.members
        pending = list(order)
        running: set[int] = set()

        async def one(i: int) -> None:
            try:
                await self._member(plan, kind, i, watch)
            except Exception as exc:  # a bug here fails the member, never the whole walk
                members[i].phase, members[i].error = MemberPhase.failed, _short(repr(exc))
                members[i].error_type = "WorkflowError"
            finally:
                running.discard(i)

        while pending or running:
            self._show()
            for i in list(pending):
                if len(running) >= (parallel or self._request.max_parallel):
                    break
                blocked = [d for d in deps[i] if members[d].phase in NOT_OK]
                if stop is not None and stop():
                    members[i].phase = MemberPhase.skipped
                    members[i].error = "not started: the rollout is over its error budget"
                    pending.remove(i)
                elif blocked:
                    members[i].phase = MemberPhase.skipped
                    members[i].error = f"skipped: {members[blocked[0]].stack} did not succeed"
                    pending.remove(i)
                elif all(members[d].phase == MemberPhase.succeeded for d in deps[i]):
                    pending.remove(i)
                    running.add(i)
                    if kind == SetOperation.apply:
                        self._ran.append(i)
                    members[i].phase = MemberPhase.running
                    asyncio.create_task(one(i))  # noqa: RUF006 - awaited through `running`
            if running:
                count = len(running)
                await workflow.wait_condition(lambda c=count: len(running) < c)  # type: ignore[misc]

    async def _member(self, plan: SetPlan, kind: SetOperation, i: int, watch: bool) -> None:
        assert self._view is not None and self._request is not None
        view, planned = self._view.members[i], plan.members[i]
        spec_ref = planned.spec_ref
        try:
            if kind != SetOperation.destroy and spec_ref is not None and planned.references:
                changing = (
                    {
                        str(plan.members[u].stack): [
                            x for x in ids if x in self._changing.get(u, [])
                        ]
                        for u, ids in planned.upstream.items()
                    }
                    if kind == SetOperation.preview
                    else {}
                )
                resolved: ResolveResult = await workflow.execute_activity_method(
                    SetActivities.resolve_member,
                    ResolveInput(
                        project=planned.project,
                        workspace=planned.workspace,
                        spec_ref=spec_ref,
                        changing={k: v for k, v in changing.items() if v},
                    ),
                    **common.store_call(f"resolve references of {planned.stack}"),
                )
                spec_ref = resolved.spec_ref
                view.unknown, view.unknown_count = resolved.unknown, resolved.unknown_count
            request = OperationInput(
                project=planned.project,
                workspace=planned.workspace,
                spec_ref=spec_ref if kind != SetOperation.destroy else None,
                auto_approve=True,
                operator=self._request.operator,
                max_concurrency=self._request.max_concurrency,
                brief_result=True,
                watch=watch,
                set_run=self._set_run(),
            )
            approval = self._gate.approval or {}
            forward = kind == SetOperation.apply and planned.four_eyes
            by = approval.get("by") if forward and approval.get("decision") == "approved" else None
            result = await self._child(WORKFLOWS[kind], request, kind, by)
        except ActivityError as exc:
            raise_if_cancelled(exc)
            view.phase, view.error = MemberPhase.failed, _short(failure_message(exc))
            view.error_type = cause_type(exc)
            return
        except _Busy as busy:
            view.phase, view.error, view.error_type = MemberPhase.failed, str(busy), "StackLocked"
            return
        except ChildWorkflowError as exc:
            raise_if_cancelled(exc)
            view.phase, view.error = MemberPhase.failed, _short(failure_message(exc))
            view.error_type = cause_type(exc)
            view.changed = kind == SetOperation.apply
            return
        view.revision = result.revision
        view.error, view.error_type = _short(result.error), result.error_type
        if kind == SetOperation.preview:
            view.policy = None if result.policy is None else result.policy.outcome.value
            summary = result.changes.get("summary") or {}
            view.counts = {action: n for action, n in summary.items() if n}
            read = sorted({x for m in plan.members for x in m.upstream.get(i, [])})
            changed = {c.get("id") for c in result.changes.get("changes") or []}
            # past the brief's list, every value read from a changing stack is unknown
            every = bool(result.changes.get("truncated"))
            self._changing[i] = [x for x in read if every or x in changed]
        else:
            view.counts = dict(result.counts)
            view.changed = result.revision is not None and sum(result.counts.values()) > 0
        view.phase = MemberPhase.failed if result.error else MemberPhase.succeeded

    async def _child(
        self,
        name: str,
        request: OperationInput,
        kind: SetOperation | str,
        approved_by: str | None = None,
    ) -> OperationResult:
        """Run one member's workflow under its stack's id; a busy stack is not waited for.
        ``approved_by``: the set's approver, whose approval a four-eyes member's run (which
        waits for an approver whatever auto_approve says) is given once it waits."""
        assert self._view is not None and self._request is not None
        stack = request.stack
        wid = preview_workflow_id(stack) if kind == SetOperation.preview else workflow_id_for(stack)
        try:
            handle = await workflow.start_child_workflow(
                name,
                request,
                id=wid,
                result_type=OperationResult,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                static_summary=f"{kind} {stack} (set {self._view.name})",
            )
        except WorkflowAlreadyStartedError:
            raise _Busy(
                f"{stack} is busy: {wid} is already running (another run holds the stack); "
                "the set does not wait for it"
            ) from None
        for member in self._view.members:
            if member.stack == stack:
                member.workflow_id = wid
                run = handle.first_execution_run_id or ""
                member.runs = [*member.runs, run][-RUNS_KEPT:]
        forwarding = None
        if approved_by is not None:
            wait = self._request.approval_timeout_seconds
            forwarding = workflow.start_activity_method(
                SetActivities.forward_approval,
                ForwardInput(
                    workflow_id=wid,
                    run_id=handle.first_execution_run_id or "",
                    by=approved_by,
                    reason=f"set {self._view.name}",
                    wait_seconds=wait,
                ),
                start_to_close_timeout=timedelta(seconds=wait + 60),
                heartbeat_timeout=common.RESOURCE_HEARTBEAT,
                retry_policy=common.STORE_RETRY,
                summary=f"forward the set's approval to {stack}",
            )
        result: OperationResult = await handle
        if forwarding is not None:
            try:
                await forwarding  # it sees the run ended within a second
            except ActivityError as exc:
                raise_if_cancelled(exc)
                workflow.logger.warning("approval not forwarded: %s", failure_message(exc))
        return result

    def _set_run(self) -> str | None:
        """What member runs' releases record as the set run that made them."""
        if self._view is None or not patched(SET_RUN_ON_RELEASES):
            return None
        return f"{self._view.name}/{workflow.info().first_execution_run_id}"

    # ---- rollback --------------------------------------------------------------------------
    async def _roll_back(self) -> None:
        """Each member this run changed, in the reverse of the order they started, back to
        its release before."""
        assert self._view is not None and self._request is not None
        self._view.phase = "rollingBack"
        self._show()
        for i in reversed(self._ran):
            member = self._view.members[i]
            if not member.changed:
                continue
            request = OperationInput(
                project=member.project,
                workspace=member.workspace,
                to_revision=member.before,
                auto_approve=True,
                operator=self._request.operator,
                max_concurrency=self._request.max_concurrency,
                brief_result=True,
                set_run=self._set_run(),
            )
            name = "RollbackWorkflow" if member.before is not None else "DestroyWorkflow"
            try:
                result = await self._child(name, request, "rollback")
            except (_Busy, ChildWorkflowError) as exc:
                raise_if_cancelled(exc)
                member.error = _short(f"{member.error}; rollback failed: {failure_message(exc)}")
                continue
            if result.error:
                member.error = _short(f"{member.error}; rollback failed: {result.error}")
                continue
            member.phase, member.revision = MemberPhase.rolled_back, result.revision
            self._view.rolled_back.append(str(member.stack))

    # ---- queries & updates -----------------------------------------------------------------
    def _show(self) -> None:
        """The Temporal UI's current details: the set's phase and a line per stack."""
        view = self._view
        if view is None:
            return
        lines = [f"**set {markdown_text(view.name)}**: {view.operation} {view.phase}"]
        for m in view.members[:DETAIL_MEMBERS]:
            revision = f" (revision {m.revision})" if m.revision is not None else ""
            lines.append(f"- {markdown_code(str(m.stack))}: {m.phase}{revision}")
        if view.phase == Phase.awaitingApproval:
            wid = markdown_code(workflow.info().workflow_id)
            lines.append(f"approve: the `approve` Update of {wid}")
        workflow.set_current_details("\n".join(lines))

    @workflow.query
    def status(self) -> SetView:
        return self._view or SetView(name="?", operation=SetOperation.apply)

    def _steering_phase(self) -> Phase:
        phase = self._view.phase if self._view is not None else ""
        waits = (Phase.awaitingApproval, Phase.awaitingDecision)
        return Phase(phase) if phase in waits else Phase.generating


class _Busy(Exception):
    """A member's stack is held by another run."""
