"""Verbs that attach to a stack's running operation (workflow ``stackflow/<p>/<w>``):
``status``, ``approve``, ``reject``, ``retry``, ``abort``, ``cancel``. The same Updates work
from the Temporal UI and ``temporal workflow update execute``."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stackflow.cli.api_mode import api_mode
from stackflow.cli.app import app
from stackflow.cli.options import (
    OutputOpt,
    ProjectOpt,
    WaitOpt,
    WorkspaceOpt,
)
from stackflow.cli.output import OutputFormat, echo_safe
from stackflow.cli.quick import print_status, ui_link
from stackflow.core.errors import NotFoundError, OperationFailed
from stackflow.core.refs import StackRef

if TYPE_CHECKING:  # the Temporal SDK is imported only when a command talks to Temporal
    from temporalio.client import WorkflowHandle

    from stackflow.cli.connection import Temporal
    from stackflow.temporal.operation import StatusView

ReasonOpt = Annotated[str | None, typer.Option("--reason", help="Recorded with the decision.")]


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


def _steer(name: str, stack: StackRef, reason: str | None, timeout: float) -> None:
    if api_mode():
        from stackflow.cli import remote

        echo_safe(remote.steer(stack, name, reason))
        return
    echo_safe(asyncio.run(_update(stack, name, reason, timeout)))


@app.command()
def approve(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    reason: ReasonOpt = None,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Approve the stack's operation waiting in awaitingApproval."""
    _steer("approve", StackRef(project, workspace), reason, unavailable_timeout)


@app.command()
def reject(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    reason: ReasonOpt = None,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Reject the stack's operation waiting in awaitingApproval (it ends failed)."""
    _steer("reject", StackRef(project, workspace), reason, unavailable_timeout)


@app.command()
def retry(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    reason: ReasonOpt = None,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Re-run the failed nodes (and those skipped because of them) of a paused run."""
    _steer("retry", StackRef(project, workspace), reason, unavailable_timeout)


@app.command()
def abort(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    reason: ReasonOpt = None,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """End a paused run as failed, as it is."""
    _steer("abort", StackRef(project, workspace), reason, unavailable_timeout)


@app.command()
def cancel(
    project: ProjectOpt, workspace: WorkspaceOpt = "default", unavailable_timeout: WaitOpt = 600.0
) -> None:
    """Cancel the stack's running operation; its release ends failed, saying so."""

    async def run() -> str:
        from stackflow.cli.connection import Temporal

        stack = StackRef(project, workspace)
        temporal = Temporal(unavailable_timeout, stack)
        handle = await _handle(temporal, stack)
        await temporal.call("cancel", handle.cancel)
        return handle.id

    if api_mode():
        from stackflow.cli import remote

        typer.echo(
            f"cancel requested for {remote.steer(StackRef(project, workspace), 'cancel', None)}"
        )
        return
    typer.echo(f"cancel requested for {asyncio.run(run())}")


@app.command()
def status(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Phase and progress of the stack's running operation."""

    stack = StackRef(project, workspace)

    async def run() -> tuple[StatusView, str]:
        from temporalio.service import RPCError, RPCStatusCode

        from stackflow.cli.connection import Temporal
        from stackflow.temporal.operation import StatusView

        temporal = Temporal(unavailable_timeout, stack)
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
        return view, ui_link(temporal.namespace, handle.id, None)

    if api_mode():
        from stackflow.cli import remote

        view, link = remote.status(stack)
    else:
        view, link = asyncio.run(run())
    print_status(view.model_dump(mode="json"), link, output.value)
