"""`stackflow drift check|schedule|unschedule|status`: drift detection through DriftWorkflow,
now or on a Temporal Schedule (listed on the UI's Schedules page)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stackflow.cli.api_mode import api_client
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.options import (
    OutputOpt,
    ProjectOpt,
    WaitOpt,
    WorkspaceOpt,
)
from stackflow.cli.output import OutputFormat, echo_safe
from stackflow.cli.report import BAD_INPUT_TYPES
from stackflow.cli.runs import console_for
from stackflow.core.errors import (
    OperationFailed,
    SpecError,
    StackflowError,
)
from stackflow.core.refs import StackRef
from stackflow.model.drift import DriftReport, parse_every, schedule_id
from stackflow.temporal.operation import DriftResult

if TYPE_CHECKING:  # the Temporal SDK only where Temporal is called (not through the API)
    pass

drift_app = typer.Typer(
    help="Detect drift: live objects changed behind stackflow's back.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(drift_app, name="drift")

RepairOpt = Annotated[
    bool,
    typer.Option(
        "--repair",
        help="On drift, start an apply of the last spec (it waits for approval unless --yes).",
    ),
]
RepairYesOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="With --repair: the repair apply needs no approval (on a four-eyes project it "
        "waits for an approver other than you, its requester).",
    ),
]


class DriftFound(StackflowError):
    """``drift check`` found drift: exit 4."""

    exit_code = 4


__all__ = ["DriftFound", "drift_app", "parse_every"]


def _check_through_api(
    stack: StackRef, repair: bool, yes: bool, patience: float
) -> tuple[DriftResult, str, list[dict[str, Any]]]:
    """The check as a run of the API (``operation: drift``), followed to its end; its
    report's diffs as ``GET …/drift`` serves them."""
    import os
    import time

    from stackflow.api.models import RunOperation, RunRequest
    from stackflow.cli.runs import ui_link

    body = RunRequest(operation=RunOperation.drift, repair=repair, auto_approve=yes)
    with api_client(patience) as api:
        created = api.start_run(stack, body)
        while (view := api.get_run(stack, created.run_id)).status == "running":
            time.sleep(0.3)
        if view.result is None:
            message = view.error or f"the drift check ended {view.status}"
            if view.error_type in BAD_INPUT_TYPES:
                raise SpecError(message)
            raise OperationFailed(f"drift check failed: {message}")
        result = DriftResult.model_validate(view.result)
        rows: list[dict[str, Any]] = []
        if result.report_ref is not None:
            from stackflow.api.models import DriftStatus

            report = DriftStatus.model_validate(api.drift_status(stack))
            rows = report.drifted_resources if report.report_ref == result.report_ref else []
    namespace = os.environ.get("TEMPORAL_NAMESPACE", "default")
    return result, ui_link(namespace, created.workflow_id, created.run_id), rows


def _print_summary(
    console: Console, stack: StackRef, summary: dict[str, Any], drifted: bool
) -> None:
    colour = "red" if drifted else "green"
    console.print(
        f"[bold]drift[/] {stack}: [{colour}]{'drift found' if drifted else 'no drift'}[/] — "
        f"{summary.get('checked', 0)} checked, {summary.get('drifted', 0)} changed, "
        f"{summary.get('missing', 0)} missing, {summary.get('pending', 0)} not yet applied",
        highlight=False,
    )


def _print_diffs(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table("ID", "Change", "Field", "Recorded / desired", "Live")
    for change in rows:
        action = "missing" if change.get("action") == "Create" else "changed"
        fields = change.get("diff") or [{}]
        for field in fields[:20]:
            table.add_row(
                Text(change["id"]),
                action,
                Text(str(field.get("path", ""))),
                Text(json.dumps(field.get("new"), default=str)),
                Text(json.dumps(field.get("old"), default=str)),
            )
    console.print(table)


@drift_app.command("check")
def drift_check(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    repair: RepairOpt = False,
    yes: RepairYesOpt = False,
    output: OutputOpt = OutputFormat.table,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Run a drift check now: exit 0 no drift, 4 drift found."""
    stack = StackRef(project, workspace)
    result, link, rows = _check_through_api(stack, repair, yes, unavailable_timeout)
    if output == OutputFormat.json:
        data = result.model_dump(mode="json")
        data["drifted_resources"] = rows
        data["ui"] = link
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        console = console_for(output)
        _print_summary(console, stack, result.summary, result.drifted)
        _print_diffs(console, rows)
        if result.repair_workflow_id:
            console.print(
                f"  repair started: {result.repair_workflow_id} (approve it with "
                f"`stackflow approve -p {project} -w {workspace}` unless --yes)",
                highlight=False,
            )
        console.print(f"  Temporal UI: {link}", highlight=False)
    if result.repair_error:
        echo_safe(result.repair_error, err=True)
    if result.drifted:
        ids = ", ".join(result.summary.get("ids") or [])
        n = int(result.summary.get("drifted", 0)) + int(result.summary.get("missing", 0))
        raise DriftFound(f"drift found in {n} resource(s) of {stack}" + (f": {ids}" if ids else ""))


@drift_app.command("schedule")
def drift_schedule(
    project: ProjectOpt,
    every: Annotated[str, typer.Option("--every", help="Interval: 30s, 5m, 1h, 1h30m.")],
    workspace: WorkspaceOpt = "default",
    repair: RepairOpt = False,
    yes: RepairYesOpt = False,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """Check for drift on a Temporal Schedule (replaces the stack's schedule if it has one).

    Through the API: an operator's; --repair --yes an approver's."""
    from stackflow.api.models import DriftScheduleRequest, DriftScheduleView

    parse_every(every)
    stack = StackRef(project, workspace)
    asked = DriftScheduleRequest(every=every, repair=repair, auto_approve=yes)
    with api_client(unavailable_timeout) as api:
        view = DriftScheduleView.model_validate(api.schedule_drift(stack, asked))
    sid, created = view.schedule_id, view.created
    verb = "scheduled" if created else "rescheduled"
    typer.echo(
        f"{verb} drift checks of {stack} every {every}"
        + (" with repair" if repair else "")
        + f" (schedule {sid}; `temporal schedule list`)"
    )


@drift_app.command("unschedule")
def drift_unschedule(
    project: ProjectOpt, workspace: WorkspaceOpt = "default", unavailable_timeout: WaitOpt = 600.0
) -> None:
    """Delete the stack's drift schedule (through the API: an operator's)."""
    stack = StackRef(project, workspace)
    with api_client(unavailable_timeout) as api:
        api.unschedule_drift(stack)
    sid = schedule_id(stack)
    typer.echo(f"deleted drift schedule {sid}")


@drift_app.command("status")
def drift_status(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """The last drift report of the stack (from the state backend, or the API)."""
    from stackflow.api.models import DriftStatus

    stack = StackRef(project, workspace)
    with api_client() as api:
        status = DriftStatus.model_validate(api.drift_status(stack))
    report = DriftReport.model_validate(status.model_dump(exclude={"drifted_resources"}))
    rows = status.drifted_resources
    if output == OutputFormat.json:
        data = report.model_dump(mode="json")
        data["drifted_resources"] = rows
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    console = console_for(output)
    _print_summary(console, stack, report.summary.model_dump(), report.drifted)
    console.print(
        f"  checked at {report.checked_at.isoformat(timespec='seconds')} against release "
        f"{report.revision} by {report.workflow_id}",
        highlight=False,
    )
    if report.repair_workflow_id:
        console.print(f"  repair started: {report.repair_workflow_id}", highlight=False)
    _print_diffs(console, rows)
