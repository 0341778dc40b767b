"""PreviewWorkflow, ApplyWorkflow, DestroyWorkflow and the BatchWorkflow child.

Thin and deterministic: every read or write goes through an activity (named by string, so
no activity or runtime code is imported here). The workflow's state is the release phase;
each phase change is persisted by an activity and mirrored to search attributes.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
)

with workflow.unsafe.imports_passed_through():
    from stackflow.operation import (
        ACTION_CODES,
        CODE_ACTIONS,
        DETAIL_LIMIT,
        FLAG_UNRECORDED,
        ApprovalInput,
        BatchInput,
        BatchResult,
        ChangeBrief,
        DescribeInput,
        LoadBatchInput,
        LoadedBatch,
        NodeInput,
        NodeResult,
        NodeStatus,
        OperationInput,
        OperationPlan,
        OperationResult,
        PhaseInput,
        PlannedNode,
        PrepareInput,
        PreviewBatchInput,
        PreviewBatchResult,
        RunOwner,
        StatusView,
        references_entry,
    )
    from workflows import common
    from workflows.walker import WalkProgress, walk

PROJECT_KEY = SearchAttributeKey.for_keyword("StackflowProject")
WORKSPACE_KEY = SearchAttributeKey.for_keyword("StackflowWorkspace")
PHASE_KEY = SearchAttributeKey.for_keyword("StackflowPhase")

AWAITING_APPROVAL = "awaitingApproval"
FINALIZE_ON_EVERY_EXIT = "finalize-release-on-every-exit"
"""Patch: runs started before it end as they did (only preview failures were finalised)."""
ACTIONS = ("Create", "Update", "Delete", "UnChanged")


def _cause(exc: BaseException) -> str:
    """The innermost message of an activity/child failure: what the user needs to read."""
    while isinstance(exc, ActivityError | ChildWorkflowError) and exc.cause is not None:
        exc = exc.cause
    return str(exc) or type(exc).__name__


def raise_if_cancelled(exc: BaseException) -> None:
    """An activity or child that failed because this run is being cancelled: the run stops
    (as a cancel, so the release is closed saying so) instead of counting a failed node."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, CancelledError):
            if workflow.patched(FINALIZE_ON_EVERY_EXIT):
                raise asyncio.CancelledError(str(cause) or "cancelled") from exc
            return
        cause = cause.cause if isinstance(cause, FailureError) else None


def summarise(changes: list[dict[str, Any]], limit: int | None = None) -> dict[str, Any]:
    """``{"changes": [...], "summary": {...}}``; past ``limit`` changes, the list keeps the
    first ``limit`` changes that are not UnChanged (the summary always counts all)."""
    summary = dict.fromkeys(ACTIONS, 0)
    for change in changes:
        summary[change["action"]] = summary.get(change["action"], 0) + 1
    if limit is not None and len(changes) > limit:
        kept = [c for c in changes if c["action"] != "UnChanged"][:limit]
        return {"changes": kept, "summary": summary, "truncated": True}
    return {"changes": changes, "summary": summary}


async def run_resource_node(node: PlannedNode, batch: BatchInput) -> NodeResult:
    """One activity per resource; its summary names the resource so the UI shows it."""
    name = "delete_resource" if node.action == "Delete" else "apply_resource"
    try:
        result: NodeResult = await workflow.execute_activity(
            name,
            NodeInput(
                project=batch.project,
                workspace=batch.workspace,
                revision=batch.revision,
                spec_ref=batch.spec_ref,
                resource_id=node.id,
                action=node.action,
                watch=batch.watch,
                force=batch.force,
                adopt=batch.adopt,
                owner=batch.owner,
            ),
            result_type=NodeResult,
            start_to_close_timeout=common.RESOURCE_START_TO_CLOSE,
            schedule_to_close_timeout=common.RESOURCE_SCHEDULE_TO_CLOSE,
            heartbeat_timeout=common.RESOURCE_HEARTBEAT,
            retry_policy=common.RESOURCE_RETRY,
            summary=f"{node.action} {node.id}",
        )
        return result
    except ActivityError as exc:
        raise_if_cancelled(exc)
        return NodeResult(
            id=node.id, action=node.action, status=NodeStatus.failed, error=_cause(exc)
        )


async def walk_nodes(
    nodes: list[PlannedNode], batch: BatchInput, blocked: list[str], progress: WalkProgress
) -> list[NodeResult]:
    async def run(node: PlannedNode) -> NodeResult:
        return await run_resource_node(node, batch)

    return await walk(
        nodes,
        run,
        max_concurrency=batch.max_concurrency,
        fail_fast=batch.fail_fast,
        blocked=blocked,
        progress=progress,
    )


async def _load(batch: BatchInput) -> LoadedBatch:
    """The nodes of a batch, from the plan store (they then live only in this history)."""
    result: LoadedBatch = await workflow.execute_activity(
        "load_batch",
        LoadBatchInput(
            plan_ref=batch.plan_ref,
            deletions=batch.deletions,
            start=batch.start,
            actions=batch.actions,
            not_ok=batch.not_ok,
        ),
        result_type=LoadedBatch,
        start_to_close_timeout=common.STORE_START_TO_CLOSE,
        retry_policy=common.STORE_RETRY,
        summary=f"load {len(batch.actions) - batch.actions.count('.')} nodes",
    )
    return result


def batch_indices(batch: BatchInput) -> list[int]:
    return [batch.start + i for i, code in enumerate(batch.actions) if code != "."]


class Tally:
    """Walk results as a run keeps them: every result when the run has at most DETAIL_LIMIT
    nodes, else counts by status, the first DETAIL_LIMIT results that did not succeed and
    the first failure (so 30,000 results never enter a history)."""

    def __init__(self, full: bool) -> None:
        self.full = full
        self.results: list[NodeResult] = []
        self.counts: dict[str, int] = {}
        self.first_failed: NodeResult | None = None

    def wants_ids(self) -> bool:
        return self.full or len(self.results) < DETAIL_LIMIT or self.first_failed is None

    def add(self, result: NodeResult) -> None:
        key = result.status.value
        self.counts[key] = self.counts.get(key, 0) + 1
        if result.status == NodeStatus.failed and self.first_failed is None:
            self.first_failed = result
        if self.full or (
            result.status != NodeStatus.succeeded and len(self.results) < DETAIL_LIMIT
        ):
            self.results.append(result)

    def count(self, status: NodeStatus, n: int) -> None:
        self.counts[status.value] = self.counts.get(status.value, 0) + n

    def merge(self, batch: BatchResult) -> None:
        if self.full:
            for result in batch.results:
                self.add(result)
            return
        for key, n in batch.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        if self.first_failed is None:
            self.first_failed = batch.first_failed
        room = DETAIL_LIMIT - len(self.results)
        self.results.extend(batch.results[: max(room, 0)])


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    """Walks one batch of a large graph so no single history grows past Temporal's limits."""

    def __init__(self) -> None:
        self._progress = WalkProgress()

    @workflow.run
    async def run(self, batch: BatchInput) -> BatchResult:
        loaded = await _load(batch)
        results = await walk_nodes(loaded.nodes, batch, loaded.blocked, self._progress)
        tally = Tally(batch.full_results)
        for result in results:
            tally.add(result)
        return BatchResult(
            results=tally.results,
            counts=tally.counts,
            not_ok=[
                index
                for index, result in zip(batch_indices(batch), results, strict=True)
                if result.status != NodeStatus.succeeded
            ],
            first_failed=tally.first_failed,
        )

    @workflow.query
    def progress(self) -> dict[str, Any]:
        p = self._progress
        return {"done": p.done, "failed": p.failed, "running": p.running}


Key = tuple[str, int]
"""A preview line: ``("n", index)`` a plan node, ``("d", index)`` a plan deletion."""


class PreviewLines:
    """The preview as a run keeps it: an action code and flags per line, the full change
    (with diffs) for the first lines only (as ``PreviewBatchResult.details`` bring them),
    the references of UnChanged nodes. Deterministic; the order of lines is the order of
    the preview batches (each: its nodes, then its deletions)."""

    def __init__(self, plan: OperationPlan) -> None:
        self.plan_ref = plan.plan_ref
        self.node_codes = ["N"] * plan.node_count
        self.node_flags = [0] * plan.node_count
        self.del_codes = ["N"] * plan.deletion_count
        self.del_flags = [0] * plan.deletion_count
        self.order: list[Key] = []
        self.details: dict[Key, dict[str, Any]] = {}
        self.refs: dict[int, list[tuple[int, str]]] = {}
        self.settled: dict[int, tuple[int, str]] = {}
        self.record_only: list[int] = []

    def add(self, call: PreviewBatchInput, result: PreviewBatchResult) -> None:
        keys: list[Key] = [("n", i) for i in range(call.start, min(call.end, len(self.node_codes)))]
        keys += [("d", i) for i in range(call.start, min(call.end, len(self.del_codes)))]
        if len(result.codes) != 2 * len(keys):
            raise ApplicationError(
                f"preview batch {call.start}: {len(result.codes) // 2} changes for "
                f"{len(keys)} resources (the plan changed under the run?)",
                non_retryable=True,
            )
        for n, key in enumerate(keys):
            codes, flags = self._lists(key[0])
            codes[key[1]] = result.codes[2 * n]
            flags[key[1]] = int(result.codes[2 * n + 1])
            if result.details:
                self.details[key] = result.details[n]
        self.order.extend(keys)
        for node, ref, path in result.refs:
            self.refs.setdefault(node, []).append((ref, path))

    def _lists(self, kind: str) -> tuple[list[str], list[int]]:
        if kind == "n":
            return self.node_codes, self.node_flags
        return self.del_codes, self.del_flags

    def action(self, key: Key) -> str:
        return CODE_ACTIONS[self._lists(key[0])[0][key[1]]]

    def settle(self) -> None:
        """Second pass, in dependency order.

        A node whose attributes reference a field that this run creates or changes on another
        resource may change too, though its own preview (from the recorded values) found
        nothing: it becomes an Update "known after apply", as Terraform shows it, and is
        applied after its dependency. UnChanged nodes this stack has not recorded yet are
        applied (a no-op) only to record their state (``record_only``).
        """
        for index, code in enumerate(self.node_codes):
            if code != "N":
                continue
            moved = next(
                ((ref, path) for ref, path in self.refs.get(index, []) if self._touches(ref, path)),
                None,
            )
            if moved is not None:
                self.node_codes[index] = "U"
                self.settled[index] = moved
                change = self.details.get(("n", index))
                if change is not None:
                    change["action"] = "Update"
                    change["diff"] = [
                        *change.get("diff", []),
                        references_entry(self._moved_text(*moved)),
                    ]
            elif self.node_flags[index] & FLAG_UNRECORDED:
                self.record_only.append(index)

    def _moved_text(self, ref: int, path: str) -> str:
        detail = self.details.get(("n", ref))
        rid = detail["id"] if detail is not None else f"#{ref}"
        return f"{rid}.{path}" if path else rid

    def _touches(self, ref: int, path: str) -> bool:
        detail = self.details.get(("n", ref))
        change = {
            "action": CODE_ACTIONS[self.node_codes[ref]],
            "diff": detail.get("diff", []) if detail is not None else [],
        }
        return _touches(change, path)

    def undescribed(self) -> DescribeInput | None:
        """The lines the view shows that the run holds only as codes (large runs)."""
        if len(self.order) <= DETAIL_LIMIT:
            return None
        items = []
        for key in self._shown():
            if key in self.details:
                continue
            kind, index = key
            codes, flags = self._lists(kind)
            ref, path = self.settled.get(index, (-1, "")) if kind == "n" else (-1, "")
            items.append((kind, index, CODE_ACTIONS[codes[index]], flags[index], ref, path))
        if not items:
            return None
        assert self.plan_ref is not None
        return DescribeInput(plan_ref=self.plan_ref, items=items)

    def described(self, request: DescribeInput, changes: list[dict[str, Any]]) -> None:
        for item, change in zip(request.items, changes, strict=True):
            self.details[(item[0], item[1])] = change

    def _shown(self) -> list[Key]:
        if len(self.order) <= DETAIL_LIMIT:
            return self.order
        shown = []
        for key in self.order:
            if self.action(key) != "UnChanged":
                shown.append(key)
                if len(shown) == DETAIL_LIMIT:
                    break
        return shown

    def view(self) -> dict[str, Any]:
        """``{"changes": [...], "summary": {...}}`` (see ``summarise``)."""
        summary = dict.fromkeys(ACTIONS, 0)
        for code in (*self.node_codes, *self.del_codes):
            summary[CODE_ACTIONS[code]] += 1
        changes = [self.details[key] for key in self._shown() if key in self.details]
        if len(self.order) > DETAIL_LIMIT:
            return {"changes": changes, "summary": summary, "truncated": True}
        return {"changes": changes, "summary": summary}

    def __len__(self) -> int:
        return len(self.order)

    def picks(self) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """(plan index, action) of the nodes to apply and of the deletions to run."""
        record_only = dict.fromkeys(self.record_only)
        to_apply = [
            (i, CODE_ACTIONS[code])
            for i, code in enumerate(self.node_codes)
            if code in ("C", "U") or i in record_only
        ]
        to_delete = [(i, "Delete") for i, code in enumerate(self.del_codes) if code == "D"]
        return to_apply, to_delete


class _Operation:
    """Shared state and steps of the three operation workflows."""

    operation = "apply"

    def __init__(self) -> None:
        self._phase = "generating"
        self._revision: int | None = None
        self._total = 0
        self._progress = WalkProgress()
        self._lines: PreviewLines | None = None
        self._error: str | None = None
        self._decision: str | None = None
        self._approval: dict[str, Any] | None = None
        self._request: OperationInput | None = None

    def _changes_view(self) -> dict[str, Any]:
        return summarise([]) if self._lines is None else self._lines.view()

    # ---- queries & updates ----------------------------------------------------------------
    @workflow.query
    def status(self) -> StatusView:
        brief = self._changes_view()
        briefs = [
            ChangeBrief(id=c["id"], type=c["type"], action=c["action"], drift=c.get("drift", False))
            for c in brief["changes"]
        ]
        summary = brief["summary"]
        return StatusView(
            phase=self._phase,
            revision=self._revision,
            total=self._total,
            done=self._progress.done,
            failed=self._progress.failed,
            running=list(self._progress.running),
            changes={"changes": [b.model_dump() for b in briefs], "summary": summary},
            error=self._error,
        )

    @workflow.query
    def preview(self) -> dict[str, Any]:
        """The preview (with per-field diffs) once it is computed (capped at DETAIL_LIMIT)."""
        return self._changes_view()

    @workflow.update
    async def approve(self, approval: ApprovalInput) -> str:
        self._decide("approved", approval)
        return f"approved by {approval.by}"

    @approve.validator
    def _validate_approve(self, approval: ApprovalInput) -> None:
        self._check_awaiting()

    @workflow.update
    async def reject(self, approval: ApprovalInput) -> str:
        self._decide("rejected", approval)
        return f"rejected by {approval.by}"

    @reject.validator
    def _validate_reject(self, approval: ApprovalInput) -> None:
        self._check_awaiting()

    def _check_awaiting(self) -> None:
        if self._phase != AWAITING_APPROVAL or self._decision is not None:
            raise ApplicationError(
                f"this run is not awaiting approval (phase {self._phase})",
                type="NotAwaitingApproval",
            )

    def _decide(self, decision: str, approval: ApprovalInput) -> None:
        self._decision = decision
        self._approval = {
            "decision": decision,
            "by": approval.by,
            "reason": approval.reason,
            "at": workflow.now().isoformat(),
        }

    # ---- steps ----------------------------------------------------------------------------
    async def _prepare(self, request: OperationInput) -> OperationPlan:
        self._request = request
        workflow.upsert_search_attributes(
            [
                PROJECT_KEY.value_set(request.project),
                WORKSPACE_KEY.value_set(request.workspace),
                PHASE_KEY.value_set(self._phase),
            ]
        )
        info = workflow.info()
        plan: OperationPlan = await workflow.execute_activity(
            "prepare_operation",
            PrepareInput(
                operation=self.operation,
                request=request,
                workflow_id=info.workflow_id,
                run_id=info.run_id,
            ),
            result_type=OperationPlan,
            start_to_close_timeout=common.STORE_START_TO_CLOSE,
            retry_policy=common.STORE_RETRY,
            summary=f"prepare {self.operation} {request.project}/{request.workspace}",
        )
        self._revision = plan.revision
        return plan

    async def _set_phase(self, phase: str, **extra: Any) -> None:
        self._phase = phase
        workflow.upsert_search_attributes([PHASE_KEY.value_set(phase)])
        if self._revision is None or phase == AWAITING_APPROVAL:
            return
        assert self._request is not None
        await workflow.execute_activity(
            "set_phase",
            PhaseInput(
                project=self._request.project,
                workspace=self._request.workspace,
                revision=self._revision,
                phase=phase,
                **extra,
            ),
            start_to_close_timeout=common.STORE_START_TO_CLOSE,
            retry_policy=common.STORE_RETRY,
            summary=f"release {self._revision} → {phase}",
        )

    async def _preview(self, plan: OperationPlan) -> None:
        """Preview batches of plan ranges, then settle references; large runs also fetch
        the lines they show but hold only as codes."""
        assert self._request is not None and plan.plan_ref is not None
        request = self._request
        step = common.PREVIEW_BATCH
        calls = [
            PreviewBatchInput(
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
                with_diff=start < DETAIL_LIMIT,
            )
            for start in range(0, max(plan.node_count, plan.deletion_count), step)
        ]
        lines = PreviewLines(plan)
        # Preview batches are read-only; a few run side by side.
        for first in range(0, len(calls), 4):
            group = calls[first : first + 4]
            handles = [
                workflow.start_activity(
                    "preview_batch",
                    call,
                    result_type=PreviewBatchResult,
                    start_to_close_timeout=common.RESOURCE_START_TO_CLOSE,
                    heartbeat_timeout=common.RESOURCE_HEARTBEAT,
                    retry_policy=common.RESOURCE_RETRY,
                    summary=f"preview {_range_size(call, plan)} resources",
                )
                for call in group
            ]
            for call, handle in zip(group, handles, strict=True):
                lines.add(call, await handle)
        lines.settle()
        describe = lines.undescribed()
        if describe is not None:
            described: list[dict[str, Any]] = await workflow.execute_activity(
                "describe_changes",
                describe,
                result_type=list[dict[str, Any]],
                start_to_close_timeout=common.STORE_START_TO_CLOSE,
                retry_policy=common.STORE_RETRY,
                summary=f"describe {len(describe.items)} changes",
            )
            lines.described(describe, described)
        self._lines = lines

    async def _await_approval(self) -> bool:
        assert self._request is not None
        if self._request.auto_approve:
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

    async def _nodes(self, plan: OperationPlan, batch: BatchInput) -> list[PlannedNode]:
        if not plan.inline:
            return (await _load(batch)).nodes
        every = plan.deletions if batch.deletions else plan.nodes
        return [
            every[batch.start + i].model_copy(update={"action": CODE_ACTIONS[code]})
            for i, code in enumerate(batch.actions)
            if code != "."
        ]

    async def _walk(
        self,
        plan: OperationPlan,
        deletions: bool,
        picks: list[tuple[int, str]],
        tally: Tally,
    ) -> None:
        """Walk nodes inline, or one child workflow per batch when there are many. A batch
        names plan indices and actions; its nodes are read from the plan store."""
        assert self._request is not None and self._revision is not None
        assert plan.plan_ref is not None
        request = self._request
        info = workflow.info()
        # Distinct child ids for an apply's two walks: apply-N, then delete-N (destroy-N).
        walk_name = "delete" if deletions and self.operation == "apply" else self.operation

        def batch_of(chunk: list[tuple[int, str]], not_ok: list[int]) -> BatchInput:
            assert self._revision is not None and plan.plan_ref is not None
            start = chunk[0][0]
            actions = ["."] * (chunk[-1][0] + 1 - start)
            for index, action in chunk:
                actions[index - start] = ACTION_CODES[action]
            return BatchInput(
                project=request.project,
                workspace=request.workspace,
                revision=self._revision,
                spec_ref=plan.spec_ref,
                operation=self.operation,
                plan_ref=plan.plan_ref,
                deletions=deletions,
                start=start,
                actions="".join(actions),
                not_ok=not_ok,
                owner=RunOwner(workflow_id=info.workflow_id, run_id=info.run_id),
                full_results=tally.full,
                max_concurrency=request.max_concurrency,
                fail_fast=request.fail_fast,
                watch=request.watch,
                force=request.force,
                adopt=request.adopt,
            )

        if len(picks) <= request.batch_size:
            batch = batch_of(picks, [])
            nodes = await self._nodes(plan, batch)
            for result in await walk_nodes(nodes, batch, [], self._progress):
                tally.add(result)
            return

        not_ok: list[int] = []
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
            try:
                result = await workflow.execute_child_workflow(
                    "BatchWorkflow",
                    batch,
                    id=f"{info.workflow_id}/r{self._revision}/{walk_name}-{index}",
                    result_type=BatchResult,
                )
            except ChildWorkflowError as exc:
                raise_if_cancelled(exc)
                await self._settle_batch(plan, batch, tally, NodeStatus.failed, _cause(exc))
                not_ok.extend(i for i, _ in chunk)
                continue
            tally.merge(result)
            self._progress.done += sum(result.counts.values())
            self._progress.failed += result.counts.get(NodeStatus.failed.value, 0)
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

    async def _finish(self, tally: Tally, rejected: bool = False) -> OperationResult:
        assert self._request is not None
        failures = tally.counts.get(NodeStatus.failed.value, 0)
        if rejected:
            assert self._approval is not None
            reason = self._approval.get("reason")
            self._error = f"{self.operation} rejected by {self._approval['by']}" + (
                f": {reason}" if reason else ""
            )
        elif failures:
            first = tally.first_failed
            assert first is not None
            more = f" (and {failures - 1} more)" if failures > 1 else ""
            self._error = f"{first.id}: {first.error}{more}"
        phase = "failed" if self._error else "succeeded"
        await self._set_phase(
            phase,
            error=self._error,
            changes=brief_changes(self._changes_view()),
            approval=self._approval,
        )
        return self._result(phase, tally)

    def _result(self, phase: str, tally: Tally) -> OperationResult:
        assert self._request is not None
        changes = self._changes_view()
        lines = len(self._lines) if self._lines is not None else 0
        return OperationResult(
            project=self._request.project,
            workspace=self._request.workspace,
            operation=self.operation,
            revision=self._revision,
            phase=phase,
            changes=changes,
            results=tally.results,
            error=self._error,
            counts=dict(tally.counts),
            truncated=not tally.full or lines > DETAIL_LIMIT,
        )

    async def _guarded(self, request: OperationInput) -> OperationResult:
        """``_execute``, and whatever way it ends — cancelled (CLI, Temporal UI), an activity
        or child failure, an error in this code — the release ends final, saying why."""
        if not workflow.patched(FINALIZE_ON_EVERY_EXIT):
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
            await self._close(f"{self.operation} failed: {_cause(exc)}")
            raise  # a failure error: it fails the workflow
        except Exception as exc:
            reason = f"internal error in the {self.operation} workflow: {type(exc).__name__}: {exc}"
            await self._close(reason)
            # A plain exception would only fail the workflow task, retried forever.
            raise ApplicationError(reason, type="WorkflowError", non_retryable=True) from exc

    async def _close(self, reason: str) -> None:
        """The release becomes ``failed`` with ``reason`` (a no-op if already final)."""
        self._error = self._error or reason
        self._phase = "failed"
        workflow.upsert_search_attributes([PHASE_KEY.value_set("failed")])
        if self._revision is None or self._request is None:
            return
        try:
            await workflow.execute_activity(
                "set_phase",
                PhaseInput(
                    project=self._request.project,
                    workspace=self._request.workspace,
                    revision=self._revision,
                    phase="failed",
                    error=reason,
                    approval=self._approval,
                ),
                start_to_close_timeout=common.STORE_START_TO_CLOSE,
                schedule_to_close_timeout=common.CLOSE_SCHEDULE_TO_CLOSE,
                retry_policy=common.STORE_RETRY,
                summary=f"release {self._revision} → failed",
            )
        except ActivityError:
            # Already final, or the stack was taken from this run: the next operation's
            # recovery (it asks Temporal whether this run is alive) closes it.
            workflow.logger.warning("could not close release %s", self._revision)

    async def _execute(self, request: OperationInput) -> OperationResult:
        plan = await self._prepare(request)
        self._total = plan.node_count + plan.deletion_count
        try:
            await self._set_phase("previewing")
            await self._preview(plan)
        except ActivityError as exc:
            raise_if_cancelled(exc)
            self._error = f"preview failed: {_cause(exc)}"
            return await self._finish(Tally(full=True))
        assert self._lines is not None
        to_apply, to_delete = self._lines.picks()
        self._total = len(to_apply) + len(to_delete)
        tally = Tally(full=self._total <= DETAIL_LIMIT)
        if not to_apply and not to_delete:
            return await self._finish(tally)
        changes_anything = len(to_delete) + len(to_apply) > len(self._lines.record_only)
        if changes_anything and not await self._await_approval():
            return await self._finish(Tally(full=True), rejected=True)
        await self._set_phase("destroying" if self.operation == "destroy" else "applying")
        if to_apply:
            await self._walk(plan, False, to_apply, tally)
        if to_delete:
            await self._walk(plan, True, to_delete, tally)
        return await self._finish(tally)


def _range_size(call: PreviewBatchInput, plan: OperationPlan) -> int:
    nodes = max(0, min(call.end, plan.node_count) - call.start)
    return nodes + max(0, min(call.end, plan.deletion_count) - call.start)


def _touches(change: dict[str, Any], path: str) -> bool:
    """Whether a dependency's planned change may alter the value at ``path`` (dotted)."""
    if change["action"] == "Create":
        return True
    if change["action"] != "Update":
        return False
    diff = change.get("diff") or []
    if not diff or not path:
        return True  # no per-field detail (large runs) or the whole object is referenced
    for entry in diff:
        changed = entry["path"]
        if changed == "(references)" or changed == path:
            return True
        for a, b in ((changed, path), (path, changed)):
            if a.startswith(b) and a[len(b)] in ".[":
                return True
    return False


def brief_changes(view: dict[str, Any]) -> dict[str, Any]:
    """What the release keeps of the preview (``view``, as the run shows it): one line per
    resource shown (diffs stay in history) and the summary, which counts every line."""
    briefs = [
        {"id": c["id"], "type": c["type"], "action": c["action"], "drift": c.get("drift", False)}
        for c in view["changes"]
    ]
    brief: dict[str, Any] = {"changes": briefs, "summary": view["summary"]}
    if view.get("truncated"):
        brief["truncated"] = True
    return brief


@workflow.defn(name="ApplyWorkflow")
class ApplyWorkflow(_Operation):
    """Preview, approval, then apply the spec node by node; deletes what left the spec."""

    operation = "apply"

    @workflow.run
    async def run(self, request: OperationInput) -> OperationResult:
        if request.spec is None and request.spec_ref is None:
            raise ApplicationError(
                "apply needs a spec or a spec_ref", type="InvalidInput", non_retryable=True
            )
        return await self._guarded(request)


@workflow.defn(name="DestroyWorkflow")
class DestroyWorkflow(_Operation):
    """Deletes everything the stack's last release holds, dependents first."""

    operation = "destroy"

    @workflow.run
    async def run(self, request: OperationInput) -> OperationResult:
        return await self._guarded(request)


@workflow.defn(name="PreviewWorkflow")
class PreviewWorkflow(_Operation):
    """The three-way diff only: no release, no lock, nothing changed."""

    operation = "preview"

    @workflow.run
    async def run(self, request: OperationInput) -> OperationResult:
        if request.spec is None and request.spec_ref is None:
            raise ApplicationError(
                "preview needs a spec or a spec_ref", type="InvalidInput", non_retryable=True
            )
        plan = await self._prepare(request)
        self._total = plan.node_count + plan.deletion_count
        await self._set_phase("previewing")
        await self._preview(plan)
        self._phase = "succeeded"
        workflow.upsert_search_attributes([PHASE_KEY.value_set("succeeded")])
        return self._result("succeeded", Tally(full=True))


ALL_WORKFLOWS = [PreviewWorkflow, ApplyWorkflow, DestroyWorkflow, BatchWorkflow]
