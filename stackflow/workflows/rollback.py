"""RollbackWorkflow: a new revision that applies an earlier release's spec again."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from stackflow.model.release import Operation
    from stackflow.temporal.operation import OperationInput, OperationResult
    from stackflow.workflows.base import OperationWorkflow


@workflow.defn(name="RollbackWorkflow")
class RollbackWorkflow(OperationWorkflow):
    """Apply release ``to_revision``'s spec as a new release (``operation: rollback``,
    ``source_revision``): preview, approval and walk exactly as ApplyWorkflow."""

    operation = Operation.rollback

    @workflow.run
    async def run(self, *args: object) -> OperationResult:
        request = self._input(OperationInput, args)
        if request.to_revision is None or request.spec is not None or request.spec_ref:
            raise ApplicationError(
                "rollback needs to_revision (the release to restore) and no spec",
                type="InvalidInput",
                non_retryable=True,
            )
        return await self._guarded(request)
