"""BatchWorkflow: walks one batch of a large graph, so no single history grows past Temporal's
limits. Started by the operation workflows as a child.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.engine.budget import fit_errors
    from stackflow.temporal.operation import (
        BatchInput,
        BatchResult,
        NodeStatus,
    )
    from stackflow.workflows import common
    from stackflow.workflows.nodes import Tally, batch_indices, load_batch_nodes, walk_nodes
    from stackflow.workflows.walker import WalkProgress


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    """Walks one batch of a large graph so no single history grows past Temporal's limits."""

    def __init__(self) -> None:
        self._progress = WalkProgress()

    @workflow.run
    async def run(self, *args: object) -> BatchResult:
        batch = common.checked_input(BatchInput, args)
        loaded = await load_batch_nodes(batch)
        results = await walk_nodes(loaded.nodes, batch, loaded.blocked, self._progress)
        tally = Tally(batch.full_results)
        for result in results:
            tally.add(result)
        return BatchResult(
            results=fit_errors(tally.results),
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
