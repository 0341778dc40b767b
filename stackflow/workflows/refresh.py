"""RefreshWorkflow: record the live state of every recorded resource as a new release,
changing nothing (OpenTofu's ``apply -refresh-only``)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from stackflow.model.release import Operation, Phase
    from stackflow.temporal.operation import (
        DETAIL_LIMIT,
        NodeStatus,
        OperationInput,
        OperationResult,
    )
    from stackflow.workflows.base import OperationWorkflow
    from stackflow.workflows.nodes import Tally, cause_type, failure_message, raise_if_cancelled


@workflow.defn(name="RefreshWorkflow")
class RefreshWorkflow(OperationWorkflow):
    """Read every resource the latest release records, show what differs (the preview:
    what it would record), ask (or ``auto_approve``), then record it as a new release
    (``operation: refresh``). The infrastructure is never changed."""

    operation = Operation.refresh

    @workflow.run
    async def run(self, *args: object) -> OperationResult:
        return await self._guarded(self._input(OperationInput, args))

    async def _execute(self, request: OperationInput) -> OperationResult:
        plan = await self._prepare(request)
        self._total = plan.node_count
        try:
            await self._set_phase(Phase.previewing)
            await self._preview(plan, refresh=True)
        except ActivityError as exc:
            raise_if_cancelled(exc)
            self._error = f"refresh failed: {failure_message(exc)}"
            self._error_type = cause_type(exc)
            return await self._finish(Tally(full=True))
        assert self._lines is not None
        summary = self._lines.view()["summary"]
        changed = summary.get("Update", 0) + summary.get("Delete", 0)
        tally = Tally(full=self._total <= DETAIL_LIMIT)
        if not changed:
            return await self._finish(tally)
        if not await self._await_approval():
            return await self._finish(Tally(full=True), rejected=True)
        await self._set_phase(Phase.applying)
        self._total = changed
        await self._preview(plan, refresh=True, record=True)
        tally.count(NodeStatus.succeeded, changed)
        self._progress.done = changed
        return await self._finish(tally)
