"""Notifications, seen from the activities (:mod:`stackflow.model.notifications`): starting one
``NotifyWorkflow`` per announced run event, and that workflow's steps (which destinations
take the event, one delivery, the dead-letter record).

:func:`announce` never fails the activity that calls it: a notification that cannot even be
started is logged and left out (the run's own work is what matters). The workflow id comes
from the event's dedupe key, so an activity retried after announcing starts nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel
from temporalio import activity
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import NewEvent, short
from stackflow.model.notifications import (
    SIGNATURE_HEADER,
    Notice,
    NotificationFailure,
    body_of,
    cloud_event,
    cloud_type,
    signature,
)
from stackflow.state.protocols import NotificationStore
from stackflow.temporal import metrics

SEND_TIMEOUT = 10.0
"""Seconds one delivery may take (connect and answer)."""


class DeliverInput(BaseModel):
    target: str
    notice: Notice


class FailureInput(BaseModel):
    target: str
    notice: Notice
    attempts: int
    error: str
    run_id: str | None = None


def make_notice(
    stack: StackRef,
    run: RunRef,
    kind: str,
    event_id: str,
    data: dict[str, Any],
    at: datetime | None = None,
) -> Notice:
    """The notification of type ``kind`` about ``run``: its CloudEvent and where it goes."""
    payload = cloud_event(
        kind=kind,
        event_id=event_id,
        project=stack.project,
        workspace=stack.workspace,
        workflow_id=run.workflow_id,
        run_id=run.run_id,
        time=at or datetime.now(UTC),
        data=data,
    )
    return Notice(
        project=stack.project,
        workspace=stack.workspace,
        type=kind,
        event_id=event_id,
        event=payload,
    )


def notice_of(stack: StackRef, run: RunRef, event: NewEvent) -> Notice | None:
    """The notification an appended run event makes (None: not one that is announced)."""
    kind = cloud_type(event.type, event.data)
    if kind is None:
        return None
    # The key is the run's own (some, as run_start's, are the same in every run): with the
    # run's id it names this event of this run, the same on every attempt of the activity.
    event_id = hashlib.sha256(f"{run.run_id}/{event.key}".encode()).hexdigest()[:32]
    return make_notice(stack, run, kind, event_id, dict(event.data), event.at)


async def announce(
    store: NotificationStore, stack: StackRef, run: RunRef, events: list[NewEvent]
) -> None:
    """Start a NotifyWorkflow for each announced event, when the project has destinations."""
    notices = [n for n in (notice_of(stack, run, e) for e in events) if n is not None]
    await send_notices(store, stack, notices)


def drift_notice(stack: StackRef, run: RunRef, data: dict[str, Any]) -> Notice:
    """``io.stackflow.run.drift_detected`` of a drift check (one per check run)."""
    kind = "io.stackflow.run.drift_detected"
    event_id = hashlib.sha256(f"{run.run_id}/{kind}".encode()).hexdigest()[:32]
    return make_notice(stack, run, kind, event_id, data)


async def send_notices(store: NotificationStore, stack: StackRef, notices: list[Notice]) -> None:
    """Start a NotifyWorkflow per notice, when the project has destinations; never raises."""
    if not notices or not activity.in_activity():
        return
    try:
        targets = await asyncio.to_thread(store.notification_targets, stack.project)
        if not targets:
            return
        client, queue = activity.client(), activity.info().task_queue
        for notice in notices:
            # an earlier attempt of this activity may have announced it already
            with contextlib.suppress(WorkflowAlreadyStartedError):
                await client.start_workflow(
                    "NotifyWorkflow",
                    notice,
                    id=f"stackflow-notify/{notice.event_id}",
                    task_queue=queue,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    static_summary=f"{notice.type} of {stack}",
                )
    except Exception as exc:  # a notification never fails the run's work
        metrics.current().notification_undelivered("not_started")
        activity.logger.warning("notifications of %s not started: %s", stack, exc)


class NotifyActivities:
    def __init__(self, deps: Deps) -> None:
        self.backend = deps.backend

    @activity.defn(name="notification_targets")
    async def notification_targets(self, notice: Notice) -> list[str]:
        """The project's destinations that take this type of event, by name."""
        with temporal_errors():
            targets = await asyncio.to_thread(self.backend.notification_targets, notice.project)
            return [t.name for t in targets if notice.type in t.types]

    @activity.defn(name="deliver_notification")
    async def deliver_notification(self, inp: DeliverInput) -> None:
        """POST the CloudEvent to one destination, signed with its secret. An answer other
        than 2xx, or none within :data:`SEND_TIMEOUT`, is retried (by the workflow's policy);
        a 4xx other than 408 and 429 is the receiver refusing it: not retried."""
        targets = await asyncio.to_thread(self.backend.notification_targets, inp.notice.project)
        target = next((t for t in targets if t.name == inp.target), None)
        if target is None:
            return  # removed meanwhile: nothing to deliver to
        body = body_of(inp.notice.event)
        headers = {
            "Content-Type": "application/cloudevents+json",
            SIGNATURE_HEADER: signature(target.secret, body),
            "User-Agent": "stackflow-notify",
        }
        try:
            async with httpx.AsyncClient(timeout=SEND_TIMEOUT, follow_redirects=False) as http:
                answer = await http.post(target.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            metrics.current().notification_attempt("unreachable")
            raise ApplicationError(
                f"{target.name}: {type(exc).__name__}: {short(str(exc)) or 'no answer'}",
                type="Unreachable",
                non_retryable=False,
            ) from None
        refused = 400 <= answer.status_code < 500 and answer.status_code not in (408, 429)
        ok = 200 <= answer.status_code < 300
        metrics.current().notification_attempt(
            "delivered" if ok else "refused" if refused else "unavailable"
        )
        if ok:
            return
        raise ApplicationError(
            f"{target.name}: answered HTTP {answer.status_code}",
            type="Refused" if refused else "Unavailable",
            non_retryable=refused,
        )

    @activity.defn(name="record_notification_failure")
    async def record_notification_failure(self, inp: FailureInput) -> None:
        metrics.current().notification_undelivered("dead_lettered")
        with temporal_errors():
            failure = NotificationFailure(
                project=inp.notice.project,
                target=inp.target,
                type=inp.notice.type,
                event_id=inp.notice.event_id,
                run_id=inp.run_id,
                attempts=inp.attempts,
                error=short(inp.error) or "failed",
                failed_at=datetime.now(UTC),
            )
            await asyncio.to_thread(self.backend.record_notification_failure, failure)
