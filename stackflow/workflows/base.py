"""The steps the operation workflows (apply, destroy, preview, rollback, refresh, drift)
share: prepare, preview, approval, walk, finish, and closing the release on every way out.
Thin and deterministic: every read or write goes through an activity (called by method
reference; its name in history is the one in ``@activity.defn``). The workflow's state is
the release phase; each phase change is persisted by an activity and mirrored to search
attributes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from stackflow.activities.observe import ObserveActivities
    from stackflow.activities.preview import PreviewActivities
    from stackflow.core.refs import RunRef
    from stackflow.engine.budget import fit_errors
    from stackflow.model.events import NewEvent, approval_wait, change_summary
    from stackflow.model.plan import PlannedNode
    from stackflow.model.release import Operation, Phase
    from stackflow.state.diff_store import DIFF_REFS_LIMIT
    from stackflow.temporal.activity_io import (
        DiffIndexInput,
        EventsInput,
        PhaseInput,
        PrepareInput,
        PreviewBatchInput,
        PreviewBatchResult,
        RefreshBatchInput,
    )
    from stackflow.temporal.operation import (
        DETAIL_LIMIT,
        NOT_OK_LIMIT,
        BatchInput,
        BatchResult,
        NodeResult,
        NodeStatus,
        OperationInput,
        OperationPlan,
        OperationResult,
    )
    from stackflow.temporal.runtime_queues import parts
    from stackflow.temporal.wire import BatchActions
    from stackflow.workflows import common, patches
    from stackflow.workflows.constants import (
        AWAITING_APPROVAL,
        AWAITING_DECISION,
        BOUNDED_NOT_OK,
        FAIL_FAST_STOPS_DELETES,
        FINALIZE_ON_EVERY_EXIT,
        HELD_ATTRIBUTES,
        INDEX_DIFF_REFS,
        PHASE_KEY,
        PROJECT_KEY,
        RUN_EVENTS,
        SLIDING_PREVIEW_WINDOW,
        WORKSPACE_KEY,
    )
    from stackflow.workflows.lines import PreviewLines, brief_changes, range_size, result_brief
    from stackflow.workflows.nodes import (
        Tally,
        batch_indices,
        cause_type,
        failure_message,
        load_batch_nodes,
        no_worker_line,
        raise_if_cancelled,
        walk_nodes,
    )
    from stackflow.workflows.phases import append_events, prepare_run, write_phase
    from stackflow.workflows.steering import WALKING, NotOk, SteeredRun
    from stackflow.workflows.walker import WalkProgress
    from stackflow.workflows.windows import in_order


M = TypeVar("M", bound=BaseModel)


class OperationWorkflow(SteeredRun):
    """The steps of the operation workflows (each subclass is one): prepare, preview, the
    gate (policy, approval: :class:`~stackflow.workflows.gate.Gate`), walk, finish, close."""

    # ---- steps ----------------------------------------------------------------------------
    def _input(self, model: type[M], args: tuple[object, ...]) -> M:
        """The run's argument as ``model`` (``common.checked_input``); when it is not one,
        the run fails at once and its ``status`` query says why."""
        try:
            return common.checked_input(model, args)
        except ApplicationError as err:
            self._phase = Phase.failed
            self._error = err.message
            self._error_type = err.type
            raise

    async def _prepare(self, request: OperationInput) -> OperationPlan:
        self._request = request
        stack = [PROJECT_KEY.value_set(request.project), WORKSPACE_KEY.value_set(request.workspace)]
        if patches.patched(HELD_ATTRIBUTES):
            self._held = stack  # they go out with the first phase, in this workflow task
        else:
            workflow.upsert_search_attributes([*stack, PHASE_KEY.value_set(self._phase)])
        info = workflow.info()
        try:
            plan = await prepare_run(
                PrepareInput(
                    operation=self.operation,
                    request=request,
                    workflow_id=info.workflow_id,
                    run_id=info.run_id,
                ),
                f"prepare {self.operation} {request.stack}",
            )
        except BaseException:
            if self._held:
                self._attributes()  # a run that fails here is listed under its stack too
            raise
        self._revision = plan.revision
        self._gate.four_eyes = plan.four_eyes
        self._gate.takes_over = plan.takes_over
        return plan

    async def _set_phase(self, phase: Phase, hold: bool = False, **extra: Any) -> None:
        self._phase = phase
        if phase in WALKING:
            self._progress.started = workflow.now()
        if not hold:  # held: the next phase's upsert, in this workflow task, is the one seen
            self._attributes(PHASE_KEY.value_set(phase))
        self._show()
        if self._revision is None:
            return
        assert self._request is not None
        if phase in (AWAITING_APPROVAL, AWAITING_DECISION):
            if patches.patched(RUN_EVENTS):
                approval = phase == AWAITING_APPROVAL
                timeout = (
                    self._request.approval_timeout_seconds
                    if approval
                    else self._request.decision_timeout_seconds
                )
                wait = "approval" if approval else "decision"
                await self._announce(approval_wait(wait, timeout, four_eyes=self._gate.four_eyes))
            return
        await write_phase(
            PhaseInput(
                project=self._request.project,
                workspace=self._request.workspace,
                revision=self._revision,
                phase=phase,
                events=self._take_events(),
                **extra,
            ),
            f"release {self._revision} → {phase}",
        )

    def _take_events(self) -> list[NewEvent]:
        events, self._events = self._events, []
        return events

    async def _announce(self, *events: NewEvent) -> None:
        """Append what only the workflow knows (with what it held back) to the run's
        event stream."""
        assert self._request is not None
        every = [*self._take_events(), *events]
        try:
            await append_events(
                EventsInput(
                    project=self._request.project,
                    workspace=self._request.workspace,
                    events=every,
                ),
                f"{len(every)} events",
            )
        except ActivityError as exc:
            # A cancel that lands while the events are appended is the run's cancel; any
            # other failure loses these events, never the run.
            raise_if_cancelled(exc)
            workflow.logger.warning("events not appended: %s", failure_message(exc))

    async def _preview(
        self, plan: OperationPlan, refresh: bool = False, record: bool = False, local: bool = False
    ) -> None:
        """Preview batches of plan ranges, then settle references (large runs fetch the lines
        they show, held as codes). ``refresh``: ``refresh_batch`` diffs each recorded resource
        against its live object (``record``: and writes it). ``local``: see ``local_first``."""
        assert self._request is not None and plan.plan_ref is not None
        request = self._request
        step = common.PREVIEW_BATCH
        kind = RefreshBatchInput if refresh else PreviewBatchInput
        extra = {"record": record} if kind is RefreshBatchInput else {}
        calls = [
            kind(
                **extra,
                project=request.project,
                workspace=request.workspace,
                spec_ref=plan.spec_ref,
                revision=plan.revision,
                plan_ref=plan.plan_ref,
                start=start,
                end=start + step,
                ignore_fields=request.ignore_fields,
                force=request.force,
                adopt=request.adopt,
                unavailable_timeout_seconds=request.unavailable_timeout_seconds,
                with_diff=start < DETAIL_LIMIT,
            )
            for start in range(0, max(plan.node_count, plan.deletion_count), step)
        ]
        lines = PreviewLines(plan)
        batch_activity: Callable[[Any, Any], Coroutine[Any, Any, PreviewBatchResult]] = (
            ObserveActivities.refresh_batch if refresh else PreviewActivities.preview_batch
        )
        # Preview batches are read-only; a few run side by side. A range whose resources
        # belong to runtimes on different task queues goes to each queue for its part.
        routes = parts(plan.queues)
        verb = "record" if record else "refresh" if refresh else "preview"

        def start(call: Any) -> Coroutine[Any, Any, PreviewBatchResult]:
            what = f"{verb} {range_size(call, plan)} resources"  # local: one small batch
            if not local:
                return started(call, what)
            return common.local_first(batch_activity, call, what, lambda: started(call, what))

        def started(call: Any, what: str) -> Coroutine[Any, Any, PreviewBatchResult]:
            if local:  # the local attempt's fallback may retry a while: its phase is seen
                self._attributes(PHASE_KEY.value_set(Phase.previewing))
            handles = [
                (
                    queue,
                    types,
                    workflow.start_activity_method(
                        batch_activity,
                        call if types is None else call.model_copy(update={"runtimes": types}),
                        **common.resource_call(what, queue, plan.queue_wait_seconds),
                    ),
                )
                for queue, types in routes
            ]

            async def results() -> PreviewBatchResult:
                found = []
                for queue, types, handle in handles:
                    try:
                        found.append(await handle)
                    except ActivityError as exc:
                        served = types or sorted(t for t, q in plan.queues.items() if q == queue)
                        wait = plan.queue_wait_seconds
                        self._no_worker = no_worker_line(exc, queue, ", ".join(served), wait)
                        raise
                return PreviewBatchResult.merge(found)

            return results()

        width = common.PREVIEW_WINDOW
        sliding = len(calls) > width and patches.patched(SLIDING_PREVIEW_WINDOW)
        async for call, result, checkpoint in in_order(calls, start, width, sliding=sliding):
            lines.add(call, result)
            if not checkpoint:
                continue
            if len(lines.diff_refs) > DIFF_REFS_LIMIT and patches.patched(INDEX_DIFF_REFS):
                index: str = await workflow.execute_activity_method(
                    PreviewActivities.index_diffs,
                    DiffIndexInput(refs=lines.diff_refs),
                    **common.store_call(f"index {len(lines.diff_refs)} diffs"),
                )
                lines.fold_diffs(index)
        lines.settle()
        describe = lines.undescribed()
        if describe is not None:
            described: list[dict[str, Any]] = await workflow.execute_activity_method(
                PreviewActivities.describe_changes,
                describe,
                **common.store_call(f"describe {len(describe.items)} changes"),
            )
            lines.described(describe, described)
        self._lines = lines
        if not record and patches.patched(RUN_EVENTS):
            summary = change_summary(str(self.operation), lines.view()["summary"])
            self._events.append(summary)  # goes out with the next phase or wait

    async def _nodes(self, plan: OperationPlan, batch: BatchInput) -> list[PlannedNode]:
        if not plan.inline:
            return (await load_batch_nodes(batch)).nodes
        every = plan.deletions if batch.deletions else plan.nodes
        return [
            every[batch.start + i].model_copy(update={"action": code.action})
            for i, code in BatchActions.decode(batch.actions)
        ]

    async def _walk(
        self,
        plan: OperationPlan,
        deletions: bool,
        picks: list[tuple[int, str]],
        tally: Tally,
        skip_reason: str | None = None,
    ) -> None:
        """Walk nodes inline, or one child workflow per batch when there are many. A batch
        names plan indices and actions; its nodes are read from the plan store. With a
        ``skip_reason`` every node is settled as skipped without running."""
        assert self._request is not None and self._revision is not None
        assert plan.plan_ref is not None
        request = self._request
        info = workflow.info()
        # Distinct child ids for an apply's two walks: apply-N, then delete-N (destroy-N).
        deleting_in_apply = deletions and self.operation != Operation.destroy
        walk_name = "delete" if deleting_in_apply else str(self.operation)

        def batch_of(chunk: list[tuple[int, str]], not_ok: list[int]) -> BatchInput:
            assert self._revision is not None and plan.plan_ref is not None
            start, actions = BatchActions.encode(chunk)
            return BatchInput(
                project=request.project,
                workspace=request.workspace,
                revision=self._revision,
                spec_ref=plan.spec_ref,
                operation=self.operation,
                plan_ref=plan.plan_ref,
                deletions=deletions,
                start=start,
                actions=actions,
                not_ok=not_ok,
                owner=RunRef(workflow_id=info.workflow_id, run_id=info.run_id),
                unavailable_timeout_seconds=request.unavailable_timeout_seconds,
                full_results=tally.full,
                queues=plan.queues,
                grouping=plan.grouping,
                queue_wait_seconds=plan.queue_wait_seconds,
                max_concurrency=request.max_concurrency,
                fail_fast=request.fail_fast,
                watch=request.watch,
                force=request.force,
                adopt=request.adopt,
            )

        not_ok: list[int] = []
        if deletions:
            self._not_ok.deletions = not_ok
        else:
            self._not_ok.nodes = not_ok
        if skip_reason is not None:
            for start in range(0, len(picks), request.batch_size):
                chunk = picks[start : start + request.batch_size]
                await self._settle_batch(
                    plan, batch_of(chunk, []), tally, NodeStatus.skipped, skip_reason
                )
                not_ok.extend(i for i, _ in chunk)
            return
        if len(picks) <= request.batch_size:
            batch = batch_of(picks, [])
            nodes = await self._nodes(plan, batch)
            results = await walk_nodes(nodes, batch, [], self._progress)
            for index, result in zip(batch_indices(batch), results, strict=True):
                tally.add(result)
                if result.status != NodeStatus.succeeded:
                    not_ok.append(index)
            return

        for index, start in enumerate(range(0, len(picks), request.batch_size)):
            chunk = picks[start : start + request.batch_size]
            batch = batch_of(chunk, list(not_ok))
            if request.fail_fast and not_ok:
                await self._settle_batch(
                    plan,
                    batch,
                    tally,
                    NodeStatus.skipped,
                    "not started: an earlier node failed and fail_fast is set",
                )
                not_ok.extend(i for i, _ in chunk)
                continue
            if len(not_ok) > NOT_OK_LIMIT and patches.patched(BOUNDED_NOT_OK):
                await self._settle_batch(
                    plan,
                    batch_of(chunk, []),
                    tally,
                    NodeStatus.skipped,
                    f"not started: more than {NOT_OK_LIMIT} nodes of this walk failed or "
                    "were skipped (a walk starts no more batches past that)",
                )
                not_ok.extend(i for i, _ in chunk)
                continue
            try:
                result = await workflow.execute_child_workflow(
                    "BatchWorkflow",
                    batch,
                    id=f"{info.workflow_id}/r{self._revision}/{walk_name}-{index}",
                    result_type=BatchResult,
                )
            except ChildWorkflowError as exc:
                raise_if_cancelled(exc)
                await self._settle_batch(
                    plan, batch, tally, NodeStatus.failed, failure_message(exc)
                )
                not_ok.extend(i for i, _ in chunk)
                continue
            tally.merge(result)
            self._progress.done += sum(result.counts.values())
            self._progress.failed += result.counts.get(NodeStatus.failed.value, 0)
            self._progress.changed()
            not_ok.extend(result.not_ok)

    async def _settle_batch(
        self,
        plan: OperationPlan,
        batch: BatchInput,
        tally: Tally,
        status: NodeStatus,
        error: str,
    ) -> None:
        """Every node of a batch that did not run gets ``status``; ids are read only while
        the run still shows such results."""
        n = len(batch_indices(batch))
        self._progress.done += n
        if status == NodeStatus.failed:
            self._progress.failed += n
        if not tally.wants_ids():
            tally.count(status, n)
            return
        for node in await self._nodes(plan, batch):
            tally.add(NodeResult(id=node.id, action=node.action, status=status, error=error))

    async def _finish(
        self, tally: Tally, rejected: bool = False, aborted: bool = False
    ) -> OperationResult:
        assert self._request is not None
        failures = tally.counts.get(NodeStatus.failed.value, 0)
        if aborted:
            self._error_type = "Aborted"
            first = tally.first_failed
            what = f"{first.id}: {first.error}" if first is not None else "failed nodes"
            self._error = f"{self.operation} aborted by {self._gate.step_by} after {what}" + (
                f" (and {failures - 1} more)" if failures > 1 else ""
            )
        elif rejected:
            self._error_type = "Rejected"
            self._error = self._gate.rejection(self.operation)
        elif failures:
            first = tally.first_failed
            assert first is not None
            more = f" (and {failures - 1} more)" if failures > 1 else ""
            error = first.error or "failed"
            self._error = (error if error.startswith(first.id) else f"{first.id}: {error}") + more
            self._error_type = self._error_type or first.error_type
        phase = Phase.failed if self._error else Phase.succeeded
        await self._set_phase(
            phase,
            error=self._error,
            changes=brief_changes(self._changes_view()),
            approval=self._gate.approval,
            counts=dict(tally.counts),
            policy=self._gate.policy,
        )
        return self._result(phase, tally)

    def _result(self, phase: Phase, tally: Tally) -> OperationResult:
        assert self._request is not None
        changes, results = self._changes_view(), fit_errors(tally.results)
        lines = len(self._lines) if self._lines is not None else 0
        if self._request.brief_result:  # a parent's child (a set's member): summaries only
            changes, results = result_brief(changes, results)
        return OperationResult(
            project=self._request.project,
            workspace=self._request.workspace,
            operation=self.operation,
            revision=self._revision,
            phase=phase,
            changes=changes,
            results=results,
            error=self._error,
            error_type=self._error_type if self._error else None,
            counts=dict(tally.counts),
            policy=self._gate.policy,
            truncated=not tally.full or lines > DETAIL_LIMIT,
        )

    async def _guarded(self, request: OperationInput) -> OperationResult:
        """``_execute``, and whatever way it ends — cancelled (CLI, Temporal UI), an activity
        or child failure, an error in this code — the release ends final, saying why."""
        if not patches.patched(FINALIZE_ON_EVERY_EXIT):
            return await self._execute(request)
        try:
            return await self._execute(request)
        except asyncio.CancelledError:
            await self._close(f"{self.operation} cancelled (a cancel request reached the run)")
            raise
        except ApplicationError as exc:
            await self._close(f"{self.operation} failed: {exc}")
            raise
        except (ActivityError, ChildWorkflowError) as exc:
            await self._close(f"{self.operation} failed: {failure_message(exc)}")
            raise  # a failure error: it fails the workflow
        except Exception as exc:
            reason = f"internal error in the {self.operation} workflow: {type(exc).__name__}: {exc}"
            await self._close(reason)
            # A plain exception would only fail the workflow task, retried forever.
            raise ApplicationError(reason, type="WorkflowError", non_retryable=True) from exc

    async def _close(self, reason: str) -> None:
        """The release becomes ``failed`` with ``reason`` (a no-op if already final)."""
        self._error = self._error or reason
        self._phase = Phase.failed
        self._attributes(PHASE_KEY.value_set(Phase.failed))
        if self._revision is None or self._request is None:
            return
        try:
            await write_phase(
                PhaseInput(
                    project=self._request.project,
                    workspace=self._request.workspace,
                    revision=self._revision,
                    phase=Phase.failed,
                    error=reason,
                    approval=self._gate.approval,
                ),
                f"release {self._revision} → failed",
                closing=True,
            )
        except ActivityError:
            # Already final, or the stack was taken from this run: the next operation's
            # recovery (it asks Temporal whether this run is alive) closes it.
            workflow.logger.warning("could not close release %s", self._revision)

    async def _execute(self, request: OperationInput) -> OperationResult:
        plan = await self._prepare(request)
        self._total = plan.node_count + plan.deletion_count
        local = self._gate.local_preview(request, self.operation, plan)
        try:
            await self._set_phase(Phase.previewing, hold=local)
            await self._preview(plan, local=local)
        except ActivityError as exc:
            raise_if_cancelled(exc)
            self._error = f"preview failed: {self._no_worker or failure_message(exc)}"
            self._error_type = cause_type(exc)
            return await self._finish(Tally(full=True))
        assert self._lines is not None
        try:
            await self._gate.judge(request, self.operation, plan, list(self._lines.diff_refs))
        except ActivityError as exc:
            raise_if_cancelled(exc)
            self._error = f"policy check failed: {failure_message(exc)}"
            self._error_type = cause_type(exc)
            return await self._finish(Tally(full=True))
        denial = self._gate.denial()
        if denial is not None:
            self._error, self._error_type = denial, "PolicyDenied"
            return await self._finish(Tally(full=True))
        to_apply, to_delete = self._lines.picks()
        self._total = len(to_apply) + len(to_delete)
        tally = Tally(full=self._total <= DETAIL_LIMIT)
        if not to_apply and not to_delete:
            return await self._finish(tally)
        changes_anything = len(to_delete) + len(to_apply) > len(self._lines.record_only)
        if changes_anything and not await self._gate.await_approval(request, self._set_phase):
            return await self._finish(Tally(full=True), rejected=True)
        walking = Phase.destroying if self.operation == Operation.destroy else Phase.applying
        await self._set_phase(walking)
        await self._walks(plan, to_apply, to_delete, tally)
        while request.on_failure == "pause" and self._not_ok:
            if await self._gate.await_decision(request, self._set_phase) != "retry":
                return await self._finish(tally, aborted=True)
            retry_apply = [p for p in to_apply if p[0] in set(self._not_ok.nodes)]
            retry_delete = [p for p in to_delete if p[0] in set(self._not_ok.deletions)]
            self._total = len(retry_apply) + len(retry_delete)
            self._progress = WalkProgress(self._tick)
            self._shown_done = 0
            await self._set_phase(walking)
            again = Tally(full=tally.full)
            await self._walks(plan, retry_apply, retry_delete, again)
            tally = tally.after_retry(again)
        return await self._finish(tally)

    async def _walks(
        self,
        plan: OperationPlan,
        to_apply: list[tuple[int, str]],
        to_delete: list[tuple[int, str]],
        tally: Tally,
    ) -> None:
        """The apply walk, then the delete walk (which fail_fast skips after a failure)."""
        assert self._request is not None
        self._not_ok = NotOk()
        if to_apply:
            await self._walk(plan, False, to_apply, tally)
        if to_delete:
            stop = (
                self._request.fail_fast
                and bool(self._not_ok.nodes)
                and patches.patched(FAIL_FAST_STOPS_DELETES)
            )
            reason = "not started: an earlier node failed and fail_fast is set" if stop else None
            await self._walk(plan, True, to_delete, tally, skip_reason=reason)
        self._failures = [r for r in tally.results if r.status == NodeStatus.failed][:10]
        self._show()
