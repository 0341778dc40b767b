"""`stackflow set preview|apply|destroy -f stacks.yaml` and `stackflow set status|events|approve|
reject|retry|abort|cancel --set NAME`: many stacks as one run (SetWorkflow,
:mod:`stackflow.workflows.stack_set`), through the API as every stack command
(``POST /v1/sets/{name}/runs``, ``GET …/runs/{run_id}``, ``POST …/{step}``).

The command reads the set file and each member's spec file (paths relative to the set file)
and sends them inline; the API checks the set as the worker will (references, order, cycles:
one line, exit 2) and stores the specs. An apply shows the set's combined preview, asks once
(or takes ``--yes``) and follows the run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stackflow.cli.api_mode import api_client
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.binding_input import exit_codes
from stackflow.cli.options import FileOpt, OutputOpt, WaitOpt, YesOpt
from stackflow.cli.output import OutputFormat, echo_safe, print_json
from stackflow.cli.report import BAD_INPUT_TYPES
from stackflow.cli.runs import RunPaused, console_for
from stackflow.cli.sources import (
    BAD_SOURCE,
    AutoApproveOpt,
    OnPushOpt,
    RefOpt,
    SecretFileOpt,
    UrlOpt,
    show_view,
    source_input,
)
from stackflow.core.errors import OperationFailed, SpecError, StackflowError
from stackflow.temporal.stack_set import SetOperation, SetView

if TYPE_CHECKING:
    from rich.console import Console

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
FINAL = ("succeeded", "failed")


def show(console: Console, view: SetView) -> None:
    """The set as a table: one line per stack."""
    from rich.table import Table
    from rich.text import Text

    table = Table("Stack", "Phase", "Revision", "Changes / results", "Known after apply", "Error")
    for m in view.members:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m.counts.items()) if v)
        more = m.unknown_count - len(m.unknown)
        unknown = "\n".join(m.unknown) + (f"\n(and {more} more)" if more > 0 else "")
        table.add_row(
            Text(str(m.stack)),
            Text(str(m.phase)),
            "" if m.revision is None else str(m.revision),
            Text(counts or "-"),
            Text(unknown),
            Text(m.error or ""),
        )
    console.print(table)
    line = f"set {view.name}: {view.operation} {view.phase}"
    if view.wave is not None:
        line += f" (wave {view.wave + 1})"
    if view.rolled_back:
        line += f"; rolled back: {', '.join(view.rolled_back)}"
    console.print(Text(line))


def body_of(file: str, operation: SetOperation, **options: Any) -> tuple[str, dict[str, Any]]:
    """The set file as ``POST /v1/sets/{name}/runs`` takes it: its name and the body."""
    from stackflow.engine.spec import load_spec
    from stackflow.engine.stack_set import load_set_file

    shop = load_set_file(file)
    base = Path(file).parent
    destroy = operation == SetOperation.destroy
    members = []
    for m in shop.stacks:
        member: dict[str, Any] = {
            "project": m.project,
            "workspace": m.workspace,
            "depends_on": m.depends_on,
            "context": m.context,
        }
        if not destroy and m.spec is not None:
            member["spec"] = load_spec(base / m.spec).model_dump(mode="json", by_alias=True)
        elif not destroy and m.git is not None:
            member["source"] = m.git.source().model_dump(mode="json")
        members.append(member)
    body: dict[str, Any] = {"operation": operation.value, "members": members, **options}
    if operation == SetOperation.apply and shop.strategy is not None:
        body["strategy"] = shop.strategy.model_dump(mode="json")
    return shop.name, body


def _run(name: str, body: dict[str, Any], yes: bool, console: Console, patience: float) -> SetView:
    """Start the set run, ask for its approval once, follow it to its end (a pause on failed
    stacks: exit 4)."""
    with api_client(patience) as api:
        created = api.request("POST", f"/v1/sets/{name}/runs", json=body)
        url = created["status_url"]
        typer.echo(f"set run: {created['workflow_id']} ({created['run_id']})", err=True)
        asked = False
        while (view := SetView.model_validate(api.request("GET", url))).phase not in FINAL:
            if view.phase == "awaitingDecision":
                show(console, view)
                failed = sum(m.phase == "failed" for m in view.members)
                raise RunPaused(
                    f"set {name} paused: {failed} stack(s) failed; run them again with "
                    f"`stackflow set retry --set {name}` or end the run with `stackflow set "
                    f"abort --set {name}`"
                )
            if view.phase == "awaitingApproval" and not asked:
                asked = True
                show(console, view)
                ok = yes or typer.confirm("Apply these stacks?", err=True)
                try:
                    api.request("POST", f"{url}/{'approve' if ok else 'reject'}")
                except StackflowError as exc:  # four-eyes: another person approves
                    typer.echo(f"{exc}; waiting for `stackflow set approve --set {name}`", err=True)
            time.sleep(0.5)
        return view


def _operate(
    operation: SetOperation,
    file: str,
    yes: bool,
    output: OutputFormat,
    patience: float,
    **options: Any,
) -> None:
    name, body = body_of(file, operation, **options)
    if operation == SetOperation.destroy and not yes:
        names = ", ".join(f"{m['project']}/{m['workspace']}" for m in body["members"])
        if not typer.confirm(f"Destroy {names}?", err=True):
            raise OperationFailed("destroy not confirmed")
    body["auto_approve"] = operation == SetOperation.destroy or (
        yes and operation != SetOperation.preview
    )
    view = _run(name, body, yes, console_for(output), patience)
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


def _latest(name: str, patience: float) -> SetView:
    with api_client(patience) as api:
        return SetView.model_validate(api.request("GET", f"/v1/sets/{name}/runs/latest"))


@set_app.command("status")
def set_status(
    name: SetOpt,
    output: OutputOpt = OutputFormat.table,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """The set's latest run: per stack its phase, revision and counts."""
    view = _latest(name, unavailable_timeout)
    if output == OutputFormat.json:
        typer.echo(json.dumps(view.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        show(console_for(output), view)


def _steer(name: str, step: str, patience: float) -> None:
    """``step`` (approve, reject, retry, abort, cancel) the set's latest run."""
    with api_client(patience) as api:
        said = api.request("POST", f"/v1/sets/{name}/runs/latest/{step}")
    typer.echo(str(said.get("result", step)))


@set_app.command("events")
def set_events(
    name: SetOpt,
    follow: Annotated[bool, typer.Option("--follow", help="Until the set run ends.")] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Resume after this seq.")] = 0,
    unavailable_timeout: WaitOpt = 600.0,
) -> None:
    """The set's latest run's one event stream (``GET /v1/sets/{name}/runs/latest/events``):
    every stack's events, one JSON line each, the stack named (``stack``, ``run_id``); a
    stack's run ends with ``stack_complete``, the set run with ``run_complete``."""
    with (
        api_client(unavailable_timeout) as api,
        api.set_events(name, after=after, wait=follow) as stream,
    ):
        for event in stream:
            typer.echo(event.line())


@set_app.command("approve")
def set_approve(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Approve the set's run waiting in awaitingApproval (one approval for every stack)."""
    _steer(name, "approve", unavailable_timeout)


@set_app.command("reject")
def set_reject(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Reject the set's run waiting in awaitingApproval (nothing is applied)."""
    _steer(name, "reject", unavailable_timeout)


@set_app.command("retry")
def set_retry(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Run a paused set's failed stacks again (and those skipped because of them)."""
    _steer(name, "retry", unavailable_timeout)


@set_app.command("abort")
def set_abort(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """End a paused set run as failed, as it is."""
    _steer(name, "abort", unavailable_timeout)


@set_app.command("cancel")
def set_cancel(name: SetOpt, unavailable_timeout: WaitOpt = 600.0) -> None:
    """Cancel the set's run: its running stacks' runs are cancelled too (their releases end
    failed, saying so)."""
    _steer(name, "cancel", unavailable_timeout)


set_source_app = typer.Typer(
    help="A set's git source: signed pushes to its branch start one set run (apply or "
    "preview) of the set file at the pushed commit.",
    epilog=exit_codes("no git source bound", "a bad URL, path, branch, secret or set name"),
    no_args_is_help=True,
)
set_app.add_typer(set_source_app, name="source")
NO_SET_SOURCE = "the set has no git source"


@set_source_app.command(
    "bind",
    help="Bind the set to a set file in a git repository (replacing its binding). The "
    "webhook secret is read from --secret-file or stdin, stored sealed and never shown. "
    "Needs the approver role on every project (a `*` role).",
    epilog=exit_codes(None, BAD_SOURCE),
)
def bind_set_source(
    name: SetOpt,
    url: UrlOpt,
    path: Annotated[str, typer.Option("--path", help="The set file's path in the repository.")],
    ref: RefOpt = "main",
    on_push: OnPushOpt = "apply",
    auto_approve: AutoApproveOpt = False,
    secret_file: SecretFileOpt = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Bind the set to a set file in a git repository (help: the decorator's)."""
    source = source_input(url, path, ref, on_push, auto_approve, secret_file)
    with api_client() as api:
        view = api.set_source(name, source)
    show_view({"set": name}, view, output, "set file")


@set_source_app.command("show", epilog=exit_codes(NO_SET_SOURCE, "a bad name"))
def show_set_source(name: SetOpt, output: OutputOpt = OutputFormat.table) -> None:
    """The set's git source (never its secret)."""
    with api_client() as api:
        view = api.source(name)
    show_view({"set": name}, view, output, "set file")


@set_source_app.command("unbind", epilog=exit_codes(NO_SET_SOURCE, "a bad name"))
def unbind_set_source(name: SetOpt, output: OutputOpt = OutputFormat.table) -> None:
    """Unbind the set from its git source (an approver's of every project)."""
    with api_client() as api:
        api.unset_source(name)
    if output is OutputFormat.json:
        print_json({"set": name, "removed": True})
    else:
        echo_safe(f"set {name}: git source removed (pushes start nothing any more)")
