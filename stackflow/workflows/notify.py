"""NotifyWorkflow: deliver one run event's CloudEvent to each destination of its project that
takes its type, each with bounded retries; a delivery that never succeeds is recorded in the
dead-letter list. Started by the activity that appended the event (its own workflow: the run
never waits for it)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.notify import DeliverInput, FailureInput, NotifyActivities
    from stackflow.model.notifications import Notice
    from stackflow.workflows import common

DELIVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=4,
    non_retryable_error_types=["Refused"],
)
"""A delivery is tried 4 times over about 7 s, then recorded as failed."""


@workflow.defn(name="NotifyWorkflow")
class NotifyWorkflow:
    @workflow.run
    async def run(self, *args: object) -> dict[str, Any]:
        notice = common.checked_input(Notice, args)
        names: list[str] = await workflow.execute_activity_method(
            NotifyActivities.notification_targets,
            notice,
            **common.store_call(f"destinations of {notice.project}"),
        )
        outcomes = await asyncio.gather(*(self._deliver(notice, name) for name in names))
        return {
            "delivered": [n for n, ok in zip(names, outcomes, strict=True) if ok],
            "failed": [n for n, ok in zip(names, outcomes, strict=True) if not ok],
        }

    async def _deliver(self, notice: Notice, name: str) -> bool:
        try:
            await workflow.execute_activity_method(
                NotifyActivities.deliver_notification,
                DeliverInput(target=name, notice=notice),
                start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(minutes=10),
                retry_policy=DELIVERY_RETRY,
                summary=f"{notice.type} to {name}",
            )
            return True
        except ActivityError as exc:
            cause = exc.cause
            refused = getattr(cause, "type", None) == "Refused"
            await workflow.execute_activity_method(
                NotifyActivities.record_notification_failure,
                FailureInput(
                    target=name,
                    notice=notice,
                    attempts=1 if refused else DELIVERY_RETRY.maximum_attempts,
                    error=str(getattr(cause, "message", None) or cause or exc),
                    run_id=notice.event.get("subject"),
                ),
                **common.store_call(f"failed delivery to {name}"),
            )
            return False
