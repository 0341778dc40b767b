"""ApplyWorkflow: preview, approval, then apply the spec node by node; deletes what left it."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import (
    ApplicationError,
)

with workflow.unsafe.imports_passed_through():
    from stackflow.model.release import Operation
    from stackflow.temporal.operation import (
        OperationInput,
        OperationResult,
    )
    from stackflow.workflows.base import OperationWorkflow


@workflow.defn(name="ApplyWorkflow")
class ApplyWorkflow(OperationWorkflow):
    """Preview, approval, then apply the spec node by node; deletes what left the spec."""

    operation = Operation.apply

    @workflow.run
    async def run(self, *args: object) -> OperationResult:
        request = self._input(OperationInput, args)
        if not request.has_spec:
            raise ApplicationError(
                "apply needs a spec, a spec_ref or a source",
                type="InvalidInput",
                non_retryable=True,
            )
        return await self._guarded(request)
