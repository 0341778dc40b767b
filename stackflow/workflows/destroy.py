"""DestroyWorkflow: deletes everything the stack's last release holds, dependents first."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.model.release import Operation
    from stackflow.temporal.operation import (
        OperationInput,
        OperationResult,
    )
    from stackflow.workflows.base import OperationWorkflow


@workflow.defn(name="DestroyWorkflow")
class DestroyWorkflow(OperationWorkflow):
    """Deletes everything the stack's last release holds, dependents first."""

    operation = Operation.destroy

    @workflow.run
    async def run(self, *args: object) -> OperationResult:
        return await self._guarded(self._input(OperationInput, args))
