"""Writing a run's release phase from its workflow (the ``set_phase`` activity).

Runs started since the :data:`LOCAL_PHASE_WRITES` patch run it as a local activity: in the
workflow task that decided the phase, on the worker that runs the workflow (every workflow
worker hosts the state activities and reaches the shared state backend). That saves the
activity's round trip through its task queue and the workflow task that would follow it,
25-35 ms each on the dev server, three times a run. The write, its retries, its timeouts and
its failure are the same; the history records a marker instead of the activity's events.
Runs started before keep the activity they began with."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.walk import WalkActivities
    from stackflow.operation import PhaseInput
    from stackflow.workflows import common
    from stackflow.workflows.constants import LOCAL_PHASE_WRITES


async def write_phase(inp: PhaseInput, summary: str, *, closing: bool = False) -> None:
    """Persist ``inp.phase`` (and what comes with it) to the release and the event stream."""
    options = common.store_call(summary, closing=closing)
    if workflow.patched(LOCAL_PHASE_WRITES):
        await workflow.execute_local_activity_method(WalkActivities.set_phase, inp, **options)
    else:
        await workflow.execute_activity_method(WalkActivities.set_phase, inp, **options)
