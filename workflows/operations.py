"""PreviewWorkflow, ApplyWorkflow, DestroyWorkflow and the BatchWorkflow child.

Thin and deterministic: every read or write goes through an activity (named by string, so
no activity or runtime code is imported here). The workflow's state is the release phase;
each phase change is persisted by an activity and mirrored to search attributes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from stackflow.operation import (
        DETAIL_LIMIT,
        ApprovalInput,
        BatchInput,
        BatchResult,
        ChangeBrief,
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
        StatusView,
    )
    from workflows import common
    from workflows.walker import WalkProgress, walk

PROJECT_KEY = SearchAttributeKey.for_keyword("StackflowProject")
WORKSPACE_KEY = SearchAttributeKey.for_keyword("StackflowWorkspace")
PHASE_KEY = SearchAttributeKey.for_keyword("StackflowPhase")

AWAITING_APPROVAL = "awaitingApproval"
ACTIONS = ("Create", "Update", "Delete", "UnChanged")


def _cause(exc: BaseException) -> str:
    """The innermost message of an activity/child failure: what the user needs to read."""
    while isinstance(exc, ActivityError | ChildWorkflowError) and exc.cause is not None:
        exc = exc.cause
    return str(exc) or type(exc).__name__


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
        return NodeResult(
            id=node.id, action=node.action, status=NodeStatus.failed, error=_cause(exc)
        )


async def walk_batch(batch: BatchInput, progress: WalkProgress) -> list[NodeResult]:
    async def run(node: PlannedNode) -> NodeResult:
        return await run_resource_node(node, batch)

    return await walk(
        batch.nodes,
        run,
        max_concurrency=batch.max_concurrency,
        fail_fast=batch.fail_fast,
        blocked=batch.blocked,
        progress=progress,
    )


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    """Walks one batch of a large graph so no single history grows past Temporal's limits."""

    def __init__(self) -> None:
        self._progress = WalkProgress()

    @workflow.run
    async def run(self, batch: BatchInput) -> BatchResult:
        return BatchResult(results=await walk_batch(batch, self._progress))

    @workflow.query
    def progress(self) -> dict[str, Any]:
        p = self._progress
        return {"done": p.done, "failed": p.failed, "running": p.running}


class _Operation:
    """Shared state and steps of the three operation workflows."""

    operation = "apply"

    def __init__(self) -> None:
        self._phase = "generating"
        self._revision: int | None = None
        self._total = 0
        self._progress = WalkProgress()
        self._changes: list[dict[str, Any]] = []
        self._error: str | None = None
        self._decision: str | None = None
        self._approval: dict[str, Any] | None = None
        self._request: OperationInput | None = None

    # ---- queries & updates ----------------------------------------------------------------
    @workflow.query
    def status(self) -> StatusView:
        brief = summarise(self._changes, DETAIL_LIMIT)
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
        return summarise(self._changes, DETAIL_LIMIT)

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
        assert self._request is not None
        request = self._request
        ids = [n.id for n in plan.nodes]
        delete_ids = [n.id for n in plan.deletions]
        step = common.PREVIEW_BATCH
        calls = []
        for start in range(0, max(len(ids), len(delete_ids)), step):
            calls.append(
                PreviewBatchInput(
                    project=request.project,
                    workspace=request.workspace,
                    spec_ref=plan.spec_ref,
                    revision=plan.revision,
                    ids=ids[start : start + step],
                    delete_ids=delete_ids[start : start + step],
                    ignore_fields=request.ignore_fields,
                    force=request.force,
                    adopt=request.adopt,
                    with_diff=start < DETAIL_LIMIT,
                )
            )
        changes: list[dict[str, Any]] = []
        # Preview batches are read-only; a few run side by side.
        for first in range(0, len(calls), 4):
            group = calls[first : first + 4]
            handles = [
                workflow.start_activity(
                    "preview_batch",
                    call,
                    result_type=list[dict[str, Any]],
                    start_to_close_timeout=common.RESOURCE_START_TO_CLOSE,
                    heartbeat_timeout=common.RESOURCE_HEARTBEAT,
                    retry_policy=common.RESOURCE_RETRY,
                    summary=f"preview {len(call.ids) + len(call.delete_ids)} resources",
                )
                for call in group
            ]
            for handle in handles:
                changes.extend(await handle)
        self._changes = changes

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

    async def _walk(self, plan: OperationPlan, nodes: list[PlannedNode]) -> list[NodeResult]:
        """Walk nodes inline, or one child workflow per batch when there are many."""
        assert self._request is not None and self._revision is not None
        request = self._request

        def batch_of(chunk: list[PlannedNode], blocked: list[str]) -> BatchInput:
            assert self._revision is not None
            return BatchInput(
                project=request.project,
                workspace=request.workspace,
                revision=self._revision,
                spec_ref=plan.spec_ref,
                operation=self.operation,
                nodes=chunk,
                blocked=blocked,
                max_concurrency=request.max_concurrency,
                fail_fast=request.fail_fast,
                watch=request.watch,
                force=request.force,
                adopt=request.adopt,
            )

        if len(nodes) <= request.batch_size:
            return await walk_batch(batch_of(nodes, []), self._progress)

        results: list[NodeResult] = []
        not_ok: dict[str, None] = {}
        info = workflow.info()
        for index, start in enumerate(range(0, len(nodes), request.batch_size)):
            chunk = nodes[start : start + request.batch_size]
            blocked = sorted({d for n in chunk for d in n.deps if d in not_ok})
            if request.fail_fast and not_ok:
                chunk_results = [
                    NodeResult(
                        id=n.id,
                        action=n.action,
                        status=NodeStatus.skipped,
                        error="not started: an earlier node failed and fail_fast is set",
                    )
                    for n in chunk
                ]
            else:
                try:
                    batch_result = await workflow.execute_child_workflow(
                        "BatchWorkflow",
                        batch_of(chunk, blocked),
                        id=f"{info.workflow_id}/r{self._revision}/{self.operation}-{index}",
                        result_type=BatchResult,
                    )
                    chunk_results = batch_result.results
                except ChildWorkflowError as exc:
                    chunk_results = [
                        NodeResult(
                            id=n.id, action=n.action, status=NodeStatus.failed, error=_cause(exc)
                        )
                        for n in chunk
                    ]
            for r in chunk_results:
                self._progress.done += 1
                if r.status != NodeStatus.succeeded:
                    not_ok[r.id] = None
                    if r.status == NodeStatus.failed:
                        self._progress.failed += 1
            results.extend(chunk_results)
        return results

    async def _finish(self, results: list[NodeResult], rejected: bool = False) -> OperationResult:
        assert self._request is not None
        failures = [r for r in results if r.status == NodeStatus.failed]
        if rejected:
            assert self._approval is not None
            reason = self._approval.get("reason")
            self._error = f"{self.operation} rejected by {self._approval['by']}" + (
                f": {reason}" if reason else ""
            )
        elif failures:
            first = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            self._error = f"{first.id}: {first.error}{more}"
        phase = "failed" if self._error else "succeeded"
        await self._set_phase(
            phase,
            error=self._error,
            changes=brief_changes(self._changes),
            approval=self._approval,
        )
        return self._result(phase, results)

    def _result(self, phase: str, results: list[NodeResult]) -> OperationResult:
        assert self._request is not None
        counts: dict[str, int] = {}
        for r in results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        truncated = len(results) > DETAIL_LIMIT or len(self._changes) > DETAIL_LIMIT
        if len(results) > DETAIL_LIMIT:
            results = [r for r in results if r.status != NodeStatus.succeeded][:DETAIL_LIMIT]
        return OperationResult(
            project=self._request.project,
            workspace=self._request.workspace,
            operation=self.operation,
            revision=self._revision,
            phase=phase,
            changes=summarise(self._changes, DETAIL_LIMIT),
            results=results,
            error=self._error,
            counts=counts,
            truncated=truncated,
        )

    def _settle_references(self, plan: OperationPlan) -> dict[str, None]:
        """Second pass over the preview, in dependency order.

        A node whose attributes reference a field that this run creates or changes on another
        resource may change too, though its own preview (from the recorded values) found
        nothing: it becomes an Update "known after apply", as Terraform shows it, and is
        applied after its dependency. Also returns the UnChanged nodes this stack has not
        recorded yet: they are applied (a no-op) only to record their state.
        """
        by_id = {c["id"]: c for c in self._changes}
        record_only: dict[str, None] = {}
        for node in plan.nodes:
            change = by_id.get(node.id)
            if change is None:
                continue
            unrecorded = change.pop("unrecorded", False)
            if change["action"] != "UnChanged":
                continue
            moved = [
                f"{rid}.{path}" if path else rid
                for rid, path in node.refs
                if rid in by_id and _touches(by_id[rid], path)
            ]
            if moved:
                change["action"] = "Update"
                change["diff"] = [
                    *change.get("diff", []),
                    {
                        "path": "(references)",
                        "old": None,
                        "new": f"(known after apply: {moved[0]})",
                    },
                ]
            elif unrecorded:
                record_only[node.id] = None
        return record_only

    async def _execute(self, request: OperationInput) -> OperationResult:
        plan = await self._prepare(request)
        self._total = len(plan.nodes) + len(plan.deletions)
        try:
            await self._set_phase("previewing")
            await self._preview(plan)
        except ActivityError as exc:
            self._error = f"preview failed: {_cause(exc)}"
            return await self._finish([])
        record_only = self._settle_references(plan)
        actions = {c["id"]: c["action"] for c in self._changes}
        to_apply = [
            n.model_copy(update={"action": actions[n.id]})
            for n in plan.nodes
            if actions.get(n.id) in ("Create", "Update") or n.id in record_only
        ]
        to_delete = [
            n.model_copy(update={"action": "Delete"})
            for n in plan.deletions
            if actions.get(n.id) == "Delete"
        ]
        self._total = len(to_apply) + len(to_delete)
        if not to_apply and not to_delete:
            return await self._finish([])
        changes_anything = len(to_delete) + len(to_apply) > len(record_only)
        if changes_anything and not await self._await_approval():
            return await self._finish([], rejected=True)
        await self._set_phase("destroying" if self.operation == "destroy" else "applying")
        results = await self._walk(plan, to_apply) if to_apply else []
        if to_delete:
            results += await self._walk(plan, to_delete)
        return await self._finish(results)


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


def brief_changes(changes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the release keeps of the preview: one line per resource (diffs stay in history)."""
    briefs = [
        {"id": c["id"], "type": c["type"], "action": c["action"], "drift": c.get("drift", False)}
        for c in changes
    ]
    return summarise(briefs, DETAIL_LIMIT)


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
        return await self._execute(request)


@workflow.defn(name="DestroyWorkflow")
class DestroyWorkflow(_Operation):
    """Deletes everything the stack's last release holds, dependents first."""

    operation = "destroy"

    @workflow.run
    async def run(self, request: OperationInput) -> OperationResult:
        return await self._execute(request)


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
        self._total = len(plan.nodes) + len(plan.deletions)
        await self._set_phase("previewing")
        await self._preview(plan)
        self._settle_references(plan)
        self._phase = "succeeded"
        workflow.upsert_search_attributes([PHASE_KEY.value_set("succeeded")])
        return self._result("succeeded", [])


ALL_WORKFLOWS = [PreviewWorkflow, ApplyWorkflow, DestroyWorkflow, BatchWorkflow]
