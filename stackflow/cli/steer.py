"""Verbs that attach to a stack's running operation (workflow ``stackflow/<p>/<w>``):
``status``, ``approve``, ``reject``, ``retry``, ``abort``, ``cancel``. The same Updates work
from the Temporal UI and ``temporal workflow update execute``."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from stackflow.cli.runs import ui_link
from stackflow.core.errors import NotFoundError, OperationFailed
from stackflow.core.refs import StackRef

if TYPE_CHECKING:  # the Temporal SDK is imported only when a command talks to Temporal
    from temporalio.client import WorkflowHandle

    from stackflow.cli.connection import Temporal


async def _handle(temporal: Temporal, stack: StackRef) -> WorkflowHandle[Any, Any]:
    from temporalio.service import RPCError, RPCStatusCode

    from stackflow.temporal.operation import workflow_id_for

    client = await temporal.connect()
    handle = client.get_workflow_handle(workflow_id_for(stack))
    try:
        described = await temporal.call("describe", handle.describe)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NotFoundError(f"stack {stack} has no operation (workflow {handle.id})") from None
        raise
    if described.status is None or described.status.name != "RUNNING":
        state = described.status.name.lower() if described.status else "unknown"
        raise NotFoundError(
            f"stack {stack} has no running operation (its last run is {state}; "
            f"see `stackflow release list -p {stack.project} -w {stack.workspace}`)"
        )
    temporal.run_started = True  # from here on, an outage message says how to follow it
    return handle


async def _update(stack: StackRef, name: str, reason: str | None, timeout: float) -> str:
    from temporalio.client import WorkflowUpdateFailedError

    from stackflow.cli.connection import Temporal
    from stackflow.cli.runs import current_user
    from stackflow.temporal.operation import ApprovalInput

    temporal = Temporal(timeout, stack)
    handle = await _handle(temporal, stack)
    arg = ApprovalInput(by=current_user(), reason=reason)
    update_id = f"{name}-{uuid.uuid4().hex}"  # one id for every attempt: applied once
    try:
        result = await temporal.call(name, lambda: handle.execute_update(name, arg, id=update_id))
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        raise OperationFailed(
            f"{name} refused: {getattr(cause, 'message', None) or cause}"
        ) from None
    return str(result)


def steer_direct(action: str, o: dict[str, Any]) -> str:
    """``approve``/``reject``/``retry``/``abort`` the running operation through Temporal: what
    the Update answered; ``cancel`` it: its workflow id."""
    stack = StackRef(o["project"], o["workspace"])
    timeout = o["unavailable_timeout"]
    if action != "cancel":
        return asyncio.run(_update(stack, action, o.get("reason"), timeout))

    async def cancel() -> str:
        from stackflow.cli.connection import Temporal

        temporal = Temporal(timeout, stack)
        handle = await _handle(temporal, stack)
        await temporal.call("cancel", handle.cancel)
        return handle.id

    return asyncio.run(cancel())


def status_direct(o: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The running operation's ``StatusView`` JSON, from its ``status`` query, and its UI link."""
    stack = StackRef(o["project"], o["workspace"])

    async def run() -> tuple[dict[str, Any], str]:
        from temporalio.service import RPCError, RPCStatusCode

        from stackflow.cli.connection import Temporal
        from stackflow.temporal.operation import StatusView

        temporal = Temporal(o["unavailable_timeout"], stack)
        handle = await _handle(temporal, stack)
        try:
            view = await temporal.call(
                "status", lambda: handle.query("status", result_type=StatusView)
            )
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                raise
            raise OperationFailed(
                f"the run of {stack} did not answer the status query "
                f"({exc.message}): is a worker running on its task queue? (`stackflow worker`)"
            ) from None
        return view.model_dump(mode="json"), ui_link(temporal.namespace, handle.id, None)

    return asyncio.run(run())


__all__ = ["status_direct", "steer_direct"]
