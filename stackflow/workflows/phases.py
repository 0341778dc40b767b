"""The state activities a run calls in its own workflow task: ``prepare_operation``,
``set_phase`` and ``append_events``.

Runs started since the :data:`LOCAL_PHASE_WRITES` patch write their phase with a local
activity, and runs started since :data:`LOCAL_PREPARE` (:data:`LOCAL_EVENTS`) prepare (append
the events only the workflow knows) with one: in the workflow task
that needs it, on the worker that runs the workflow (every workflow worker hosts the state
activities and reaches the shared state backend). That saves the activity's round trip
through its task queue and the workflow task that would follow it, 25-35 ms each on the dev
server. The call, its retries, its timeouts and its failure are the same; the history
records a marker with the result instead of the activity's events (and never the input).
Runs started before keep the activities they began with."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.prepare import PrepareActivities
    from stackflow.activities.walk import WalkActivities
    from stackflow.temporal.activity_io import EventsInput, PhaseInput, PrepareInput
    from stackflow.temporal.operation import OperationPlan
    from stackflow.workflows import common, patches
    from stackflow.workflows.constants import LOCAL_EVENTS, LOCAL_PHASE_WRITES, LOCAL_PREPARE


async def prepare_run(inp: PrepareInput, summary: str) -> OperationPlan:
    """Check the run's input, open its release (taking the stack) and lay out its plan."""
    options = common.store_call(summary)
    if patches.patched(LOCAL_PREPARE):
        return await workflow.execute_local_activity_method(
            PrepareActivities.prepare_operation, inp, **options
        )
    return await workflow.execute_activity_method(
        PrepareActivities.prepare_operation, inp, **options
    )


async def write_phase(inp: PhaseInput, summary: str, *, closing: bool = False) -> None:
    """Persist ``inp.phase`` (and what comes with it) to the release and the event stream."""
    options = common.store_call(summary, closing=closing)
    if patches.patched(LOCAL_PHASE_WRITES):
        await workflow.execute_local_activity_method(WalkActivities.set_phase, inp, **options)
    else:
        await workflow.execute_activity_method(WalkActivities.set_phase, inp, **options)


async def append_events(inp: EventsInput, summary: str) -> None:
    """Append ``inp.events`` to the run's event stream (an approval wait, a preview's end)."""
    options = common.store_call(summary)
    if patches.patched(LOCAL_EVENTS):
        await workflow.execute_local_activity_method(WalkActivities.append_events, inp, **options)
    else:
        await workflow.execute_activity_method(WalkActivities.append_events, inp, **options)
