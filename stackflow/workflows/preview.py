"""PreviewWorkflow: the three-way diff only; no release, no lock, nothing changed."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
)

with workflow.unsafe.imports_passed_through():
    from stackflow.model.events import run_complete
    from stackflow.model.release import Operation, Phase
    from stackflow.temporal.operation import (
        OperationInput,
        OperationResult,
    )
    from stackflow.workflows import patches
    from stackflow.workflows.base import OperationWorkflow
    from stackflow.workflows.constants import PHASE_KEY, RUN_EVENTS
    from stackflow.workflows.nodes import Tally


@workflow.defn(name="PreviewWorkflow")
class PreviewWorkflow(OperationWorkflow):
    """The three-way diff only: no release, no lock, nothing changed."""

    operation = Operation.preview

    @workflow.run
    async def run(self, *args: object) -> OperationResult:
        request = self._input(OperationInput, args)
        if not request.has_spec:
            raise ApplicationError(
                "preview needs a spec, a spec_ref or a source",
                type="InvalidInput",
                non_retryable=True,
            )
        plan = await self._prepare(request)
        self._total = plan.node_count + plan.deletion_count
        await self._set_phase(Phase.previewing)
        try:
            await self._preview(plan)
        except ActivityError as exc:
            if self._no_worker is None:
                raise
            raise ApplicationError(self._no_worker, type="NoWorker", non_retryable=True) from exc
        await self._policy_gate(plan)
        denial = self._policy_denial()
        if denial is not None:
            self._phase, self._error, self._error_type = Phase.failed, denial, "PolicyDenied"
            self._attributes(PHASE_KEY.value_set(Phase.failed))
            await self._announce(run_complete(Phase.failed.value, error=denial))
            raise ApplicationError(denial, type="PolicyDenied", non_retryable=True)
        if patches.patched(RUN_EVENTS):
            await self._announce(run_complete(Phase.succeeded.value, counts=self._counts()))
        self._phase = Phase.succeeded
        self._attributes(PHASE_KEY.value_set(Phase.succeeded))
        return self._result(Phase.succeeded, Tally(full=True))

    def _counts(self) -> dict[str, int]:
        assert self._lines is not None
        return dict(self._lines.view()["summary"])
