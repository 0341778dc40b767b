"""A stack's drift-check Schedule on Temporal (``stackflow drift schedule``, and ``PUT
/v1/stacks/{project}/{workspace}/drift/schedule``): one per stack, under
:func:`~stackflow.model.drift.schedule_id`, starting ``DriftWorkflow`` every interval (a
check still running when the next is due is skipped). The CLI and the API build it here, so
a schedule made either way is the same."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from stackflow.model.drift import schedule_id
from stackflow.temporal.operation import DriftInput, drift_workflow_id


def drift_schedule(request: DriftInput, every: timedelta, task_queue: str) -> Schedule:
    """The Schedule of drift checks ``request`` asks for (its stack, repair, approval and
    requester), every ``every`` on ``task_queue``."""
    stack = request.stack
    by = f" (by {request.requested_by})" if request.requested_by else ""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            "DriftWorkflow",
            request,
            id=drift_workflow_id(stack),
            task_queue=task_queue,
            static_summary=f"drift check {stack}",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(note=f"stackflow drift schedule {stack.cli_flags}{by}"),
    )


async def create_or_replace(client: Client, schedule: Schedule, sid: str) -> bool:
    """Create the Schedule ``sid``, or replace the one of that id: True if it was created."""
    try:
        await client.create_schedule(sid, schedule)
        return True
    except ScheduleAlreadyRunningError:

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(sid).update(replace)
        return False


async def put_drift_schedule(
    client: Client, request: DriftInput, every: timedelta, task_queue: str
) -> tuple[str, bool]:
    """Schedule ``request``'s drift checks (replacing the stack's schedule if it has one):
    (its id, whether it was created)."""
    sid = schedule_id(request.stack)
    created = await create_or_replace(client, drift_schedule(request, every, task_queue), sid)
    return sid, created
