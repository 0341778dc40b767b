"""DriftWorkflow: read every recorded resource and diff it against its recorded state and
the last spec. No release, no lock; a report in the state backend, the ``StackflowDrift``
search attribute, and with ``repair`` an ApplyWorkflow of the last spec."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.observe import ObserveActivities
    from stackflow.model.drift import DRIFT_ID_LIMIT
    from stackflow.model.release import Operation, Phase
    from stackflow.temporal.activity_io import DriftRecordInput
    from stackflow.temporal.operation import (
        DriftInput,
        DriftResult,
        OperationInput,
        OperationResult,
        workflow_id_for,
    )
    from stackflow.workflows import common, patches
    from stackflow.workflows.base import OperationWorkflow
    from stackflow.workflows.constants import APPROVER_DECIDES, DRIFT_KEY, PHASE_KEY


@workflow.defn(name="DriftWorkflow")
class DriftWorkflow(OperationWorkflow):
    """A drift check: ``stackflow drift check`` runs one now, ``stackflow drift schedule``
    a Temporal Schedule of them."""

    operation = Operation.drift

    @workflow.run
    async def run(self, *args: object) -> DriftResult:
        inp = self._input(DriftInput, args)
        request = OperationInput(
            project=inp.project,
            workspace=inp.workspace,
            unavailable_timeout_seconds=inp.unavailable_timeout_seconds,
            operator="drift-check",
        )
        plan = await self._prepare(request)
        checked = plan.revision
        self._revision = None  # a check reads the latest release; it writes none
        self._total = plan.node_count
        await self._set_phase(Phase.previewing)
        await self._preview(plan)
        assert self._lines is not None
        summary = self._lines.drift_summary(DRIFT_ID_LIMIT)
        drifted = bool(summary["drifted"] or summary["missing"])
        repair_id: str | None = None
        repair_error: str | None = None
        if drifted and inp.repair:
            repair_id, repair_error = await self._repair(inp, plan.spec_ref)
        info = workflow.info()
        checked_at = workflow.now().isoformat()
        report_ref: str | None = await workflow.execute_activity_method(
            ObserveActivities.record_drift,
            DriftRecordInput(
                project=inp.project,
                workspace=inp.workspace,
                revision=checked,
                checked_at=checked_at,
                summary=summary,
                diff_refs=self._lines.diff_refs,
                workflow_id=info.workflow_id,
                run_id=info.run_id,
                repair_workflow_id=repair_id,
            ),
            **common.store_call(f"drift report {inp.stack}"),
        )
        self._phase = Phase.succeeded
        self._attributes(DRIFT_KEY.value_set(drifted), PHASE_KEY.value_set(Phase.succeeded))
        self._show()
        return DriftResult(
            project=inp.project,
            workspace=inp.workspace,
            drifted=drifted,
            summary=summary,
            revision=checked,
            report_ref=report_ref,
            repair_workflow_id=repair_id,
            repair_error=repair_error,
            checked_at=checked_at,
        )

    async def _repair(self, inp: DriftInput, spec_ref: str | None) -> tuple[str | None, str | None]:
        """Start an apply of the last spec under the stack's usual id (so `stackflow
        approve` finds it); it outlives this check. A stack busy with another run is
        reported, not waited for."""
        wid = workflow_id_for(inp.stack)
        requester = "drift-repair"
        if inp.requested_by is not None and patches.patched(APPROVER_DECIDES):
            requester = inp.requested_by  # who asked for the check: four-eyes holds for it
        try:
            handle = await workflow.start_child_workflow(
                "ApplyWorkflow",
                OperationInput(
                    project=inp.project,
                    workspace=inp.workspace,
                    spec_ref=spec_ref,
                    auto_approve=inp.auto_approve,
                    operator=requester,
                    unavailable_timeout_seconds=inp.unavailable_timeout_seconds,
                ),
                id=wid,
                result_type=OperationResult,
                parent_close_policy=ParentClosePolicy.ABANDON,
                static_summary=f"repair drift of {inp.stack}",
            )
        except WorkflowAlreadyStartedError:
            return None, f"not repaired: {wid} is already running an operation"
        return handle.id, None
