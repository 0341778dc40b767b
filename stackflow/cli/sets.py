"""`stackflow set preview|apply|destroy -f stacks.yaml` and `stackflow set status --set NAME`:
many stacks as one run (SetWorkflow, :mod:`stackflow.workflows.stack_set`).

The command reads the set file and each member's spec file (paths relative to the set
file), checks the set as the worker will (references, order, cycles: one line, exit 2),
stores the specs in the state backend and starts the set run with their refs. An apply
shows the set's combined preview, asks once (or takes ``--yes``) and follows the run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stackflow.cli.api_mode import api_mode, refuse_in_api_mode
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.options import FileOpt, OutputOpt, WaitOpt, YesOpt
from stackflow.cli.output import OutputFormat
from stackflow.cli.report import BAD_INPUT_TYPES
from stackflow.cli.runs import console_for, current_user, namespace, ui_link
from stackflow.cli.sets_api import FINAL, paused, show
from stackflow.core.errors import OperationFailed, SpecError, StackLockedError
from stackflow.core.refs import StackRef
from stackflow.temporal.stack_set import (
    Member,
    SetInput,
    SetOperation,
    SetView,
    checked_set_input,
    set_workflow_id,
)

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from stackflow.cli.connection import Temporal

set_app = typer.Typer(
    help="Many stacks as one run: preview, apply or destroy a set file's stacks in dependency "
    "order, values passed downstream ($stack. references); status of a set's run.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(set_app, name="set")

OnFailureSetOpt = Annotated[
    str,
    typer.Option(
        "--on-failure",
        help="halt: leave what was applied when a stack fails (its dependents are skipped); "
        "rollback: return each stack this run changed to its release before, in reverse order; "
        "pause: wait for `stackflow set retry` or `set abort` (exit 4).",
    ),
]
ParallelOpt = Annotated[
    int, typer.Option("--max-parallel", min=1, max=50, help="Stacks in flight at once.")
]
SetOpt = Annotated[str, typer.Option("--set", help="The set's name (its file's `name`).")]


def set_input(file: str, operation: SetOperation, **options: Any) -> SetInput:
    """The set file as the workflow's input: specs stored by ref, the set checked whole."""
    from stackflow.engine.spec import load_spec
    from stackflow.engine.stack_set import load_set_file
    from stackflow.state.backend import open_backend

    shop = load_set_file(file)
    base = Path(file).parent
    destroy = operation == SetOperation.destroy
    members = [
        Member(
            StackRef(m.project, m.workspace),
            m.depends_on,
            None if destroy or m.spec is None else load_spec(base / m.spec),
            None if m.git is None else m.git.source(),
            m.context,
        )
        for m in shop.stacks
    ]
    strategy = shop.strategy if operation == SetOperation.apply else None
    backend = open_backend()
    try:
        return checked_set_input(backend, shop.name, operation, members, strategy, **options)
    finally:
        backend.close()


def _failure(exc: BaseException) -> Exception:
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    typed = [c for c in chain if getattr(c, "type", None)]
    cause = typed[0] if typed else chain[-1]
    message = getattr(cause, "message", None) or str(cause)
    if getattr(cause, "type", None) in BAD_INPUT_TYPES:
        return SpecError(message)
    return OperationFailed(f"set run failed: {message}")


async def _status(temporal: Temporal, handle: WorkflowHandle[Any, Any]) -> SetView:
    return await temporal.call(
        "the set's status", lambda: handle.query("status", result_type=SetView)
    )


async def _run(request: SetInput, yes: bool, output: OutputFormat, timeout: float) -> SetView:
    from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from stackflow.cli.connection import Temporal

    temporal = Temporal(timeout)
    client = await temporal.connect()
    wid = set_workflow_id(request.name)
    console = console_for(output)
    try:
        handle = await temporal.start(
            "SetWorkflow",
            request,
            id=wid,
            result_type=SetView,
            static_summary=f"set {request.operation} {request.name}",
        )
    except WorkflowAlreadyStartedError:
        raise StackLockedError(
            f"set {request.name} is already running ({ui_link(client.namespace, wid, None)})"
        ) from None
    console.print(f"set run: {ui_link(namespace(), wid, handle.result_run_id)}", highlight=False)
    if request.operation == SetOperation.apply and not request.auto_approve:
        while (view := await _status(temporal, handle)).phase not in (*FINAL, "awaitingApproval"):
            await asyncio.sleep(0.5)
        if view.phase == "awaitingApproval":
            show(console, view)
            step = "approve" if yes or typer.confirm("Apply these stacks?", err=True) else "reject"
            try:
                await handle.execute_update(step, {"by": current_user()})
            except WorkflowUpdateFailedError as exc:  # four-eyes: another person approves
                said = getattr(exc.cause, "message", exc.cause)
                typer.echo(
                    f"{said}; waiting for `stackflow set approve --set {request.name}`", err=True
                )
    # follow the run to its end, or to a pause on failed stacks (exit 4)
    while (view := await _status(temporal, handle)).phase not in (*FINAL, "awaitingDecision"):
        await asyncio.sleep(0.5)
    if view.phase == "awaitingDecision":
        show(console, view)
        raise paused(request.name, view)
    try:
        return await temporal.call("the set run", handle.result)
    except WorkflowFailureError as exc:
        raise _failure(exc) from None


def _operate(
    operation: SetOperation,
    file: str,
    yes: bool,
    output: OutputFormat,
    timeout: float,
    **options: Any,
) -> None:
    if api_mode():
        from stackflow.cli.sets_api import run_through_api

        approve = yes and operation != SetOperation.preview
        view = run_through_api(
            file, operation, yes, console_for(output), auto_approve=approve, **options
        )
        _print(view, output)
        return
    request = set_input(file, operation, operator=current_user(), **options)
    if operation == SetOperation.destroy and not yes:
        names = ", ".join(str(m.stack) for m in request.members)
        if not typer.confirm(f"Destroy {names}?", err=True):
            raise OperationFailed("destroy not confirmed")
    request.auto_approve = yes or operation == SetOperation.destroy
    view = asyncio.run(_run(request, yes, output, timeout))
    _print(view, output)


def _print(view: SetView, output: OutputFormat) -> None:
    if output == OutputFormat.json:
        typer.echo(json.dumps(view.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        show(console_for(output), view)
    if view.phase == "failed":
        if view.error_type in BAD_INPUT_TYPES:
            raise SpecError(view.error or "bad input")
        raise OperationFailed(f"set {view.name}: {view.error}")


@set_app.command("preview")
def set_preview(
    file: FileOpt,
    output: OutputOpt = OutputFormat.table,
    parallel: ParallelOpt = 4,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Preview every stack in dependency order; a value an upstream change will produce shows
    as (known after apply)."""
    _operate(SetOperation.preview, file, True, output, unavailable_timeout, max_parallel=parallel)


@set_app.command("apply")
def set_apply(
    file: FileOpt,
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    on_failure: OnFailureSetOpt = "halt",
    max_parallel: ParallelOpt = 4,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Preview the set, ask once, then apply each stack in dependency order."""
    if on_failure not in ("halt", "rollback", "pause"):
        raise SpecError(f"--on-failure {on_failure}: give halt, rollback or pause")
    _operate(
        SetOperation.apply,
        file,
        yes,
        output,
        unavailable_timeout,
        max_parallel=max_parallel,
        on_failure=on_failure,
    )


@set_app.command("destroy")
def set_destroy(
    file: FileOpt,
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    parallel: ParallelOpt = 4,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Destroy every stack of the set, dependents first."""
    _operate(SetOperation.destroy, file, yes, output, unavailable_timeout, max_parallel=parallel)


@set_app.command("status")
def set_status(
    name: SetOpt,
    output: OutputOpt = OutputFormat.table,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """The set's latest run: per stack its phase, revision and counts."""
    from stackflow.cli.connection import Temporal

    async def status() -> SetView:
        temporal = Temporal(unavailable_timeout)
        client = await temporal.connect()
        return await _status(temporal, client.get_workflow_handle(set_workflow_id(name)))

    from temporalio.service import RPCError, RPCStatusCode

    try:
        if api_mode():
            from stackflow.cli.sets_api import latest_through_api

            view = latest_through_api(name)
        else:
            view = asyncio.run(status())
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise SpecError(f"set {name}: no run found") from None
        raise
    if output == OutputFormat.json:
        typer.echo(json.dumps(view.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        show(console_for(output), view)


def _steer(name: str, step: str, timeout: float) -> str:
    """Send the set's latest run the ``approve`` or ``reject`` Update, or cancel it."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from stackflow.cli.connection import Temporal

    if api_mode():
        if step == "cancel":
            refuse_in_api_mode("set cancel")
        from stackflow.cli.sets_api import steer_through_api

        return steer_through_api(name, step)

    async def steer() -> str:
        temporal = Temporal(timeout)
        client = await temporal.connect()
        handle = client.get_workflow_handle(set_workflow_id(name))
        if step == "cancel":
            await temporal.call("cancel", handle.cancel)
            return f"cancel requested for set {name}"
        said: str = await temporal.call(
            step, lambda: handle.execute_update(step, {"by": current_user()}, result_type=str)
        )
        return said

    try:
        return asyncio.run(steer())
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        raise OperationFailed(f"set {name}: {getattr(cause, 'message', cause)}") from None
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise OperationFailed(
                f"set {name}: no running run to {step} (its latest run ended, or it never ran)"
            ) from None
        raise


@set_app.command("events")
def set_events(
    name: SetOpt,
    follow: Annotated[bool, typer.Option("--follow", help="Until the set run ends.")] = False,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """The events of every stack's runs in the set's latest run, one JSON line each in time
    order, the stack named (``stack``); as `stackflow events` prints one run's."""
    import time

    from stackflow.cli.connection import Temporal
    from stackflow.state.backend import open_backend

    async def status() -> SetView:
        temporal = Temporal(unavailable_timeout)
        client = await temporal.connect()
        return await _status(temporal, client.get_workflow_handle(set_workflow_id(name)))

    refuse_in_api_mode("set events")
    seen: dict[tuple[str, str], int] = {}
    backend = open_backend()
    try:
        while True:
            view = asyncio.run(status())
            lines = []
            for member in view.members:
                for run_id in member.runs:
                    after = seen.get((str(member.stack), run_id), 0)
                    for event in backend.events(member.stack, run_id, after=after):
                        seen[(str(member.stack), run_id)] = event.seq
                        lines.append((event.time, {"stack": str(member.stack), **event.wire()}))
            for _, line in sorted(lines, key=lambda item: item[0]):
                typer.echo(json.dumps(line, separators=(",", ":"), ensure_ascii=False))
            if not follow or (view.phase in FINAL and not lines):
                return
            time.sleep(0.5)
    finally:
        backend.close()


@set_app.command("approve")
def set_approve(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Approve the set's run waiting in awaitingApproval (one approval for every stack)."""
    typer.echo(_steer(name, "approve", unavailable_timeout))


@set_app.command("reject")
def set_reject(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Reject the set's run waiting in awaitingApproval (nothing is applied)."""
    typer.echo(_steer(name, "reject", unavailable_timeout))


@set_app.command("retry")
def set_retry(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Run a paused set's failed stacks again (and those skipped because of them)."""
    typer.echo(_steer(name, "retry", unavailable_timeout))


@set_app.command("abort")
def set_abort(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """End a paused set run as failed, as it is."""
    typer.echo(_steer(name, "abort", unavailable_timeout))


@set_app.command("cancel")
def set_cancel(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Cancel the set's run: its running stacks' runs are cancelled too (their releases end
    failed, saying so)."""
    typer.echo(_steer(name, "cancel", unavailable_timeout))
