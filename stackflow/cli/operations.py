"""`stackflow preview|apply|destroy|worker`: commands that run through Temporal.

Each command sends the spec with the workflow input (compressed by the payload codec; it
needs nothing but Temporal) and starts the matching workflow with the stack's default id,
so a second concurrent run of the same stack is refused at once. Apply and destroy show the
preview, ask for approval (or take ``--yes``), send the approval as a workflow Update,
follow progress through the ``status`` query and print the resulting release.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
import urllib.parse
import uuid
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from stackflow.budget import BUDGET
from stackflow.cli.app import app
from stackflow.cli.connection import Temporal, settings
from stackflow.cli.output import OutputFormat, SafeConsole, masked_release_json
from stackflow.codec import PAYLOAD_LIMIT, encoded_size
from stackflow.diff import Preview
from stackflow.errors import SpecError, StackflowError, StackLockedError
from stackflow.operation import (
    ApprovalInput,
    OperationInput,
    OperationResult,
    StatusView,
    check_request,
    human_duration,
    workflow_id_for,
)
from stackflow.render import render_preview
from stackflow.spec import load_spec

FINAL = ("succeeded", "failed")
BAD_INPUT_TYPES = ("InvalidInput", "SpecError", "NotFound", "NotFoundError", "Conflict")
"""Failure classes that fixing the spec or options resolves: exit 2 (else 1)."""
PAUSED = "awaitingDecision"
POLL_SECONDS = 0.25


class OnFailure(StrEnum):
    fail = "fail"
    pause = "pause"


class OperationFailed(StackflowError):
    exit_code = 1


class RunPaused(StackflowError):
    """The run waits for retry/abort on failed nodes (``--on-failure pause``)."""

    exit_code = 4


class CannotAsk(StackflowError):
    """Approval needed but there is no terminal to ask on: bad input (exit 2)."""

    exit_code = 2


ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project of the stack.")]
WorkspaceOpt = Annotated[str, typer.Option("--workspace", "-w", help="Workspace of the stack.")]
FileOpt = Annotated[str, typer.Option("--file", "-f", help="Spec file (YAML/JSON); '-' = stdin.")]
OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="table or json.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Approve without asking.")]
ConcurrencyOpt = Annotated[int, typer.Option("--max-concurrency", help="Resources in flight.")]
IgnoreOpt = Annotated[
    list[str] | None, typer.Option("--ignore-field", help="Dotted path never diffed (repeat).")
]
WatchOpt = Annotated[bool, typer.Option("--watch", help="Wait until each resource is ready.")]
FailFastOpt = Annotated[bool, typer.Option("--fail-fast", help="Stop starting nodes on failure.")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Take over fields another manager owns (Kubernetes).")
]
AdoptOpt = Annotated[
    bool, typer.Option("--adopt", help="Adopt existing objects that no stack owns yet.")
]
DetailOpt = Annotated[bool, typer.Option("--detail/--no-detail", help="Show per-field diffs.")]
OnFailureOpt = Annotated[
    OnFailure,
    typer.Option(
        "--on-failure",
        help="fail: end the run when nodes fail; pause: wait for `stackflow retry` or `abort`.",
    ),
]
TargetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        help="Only resources whose id matches this glob, and what they depend on (repeat).",
    ),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        help="Leave out resources whose id matches this glob, and what depends on them "
        "(repeat); their state is kept as recorded.",
    ),
]
UnavailableOpt = Annotated[
    float,
    typer.Option(
        "--unavailable-timeout",
        help="Seconds unreachable infrastructure is retried before its node fails; also how "
        "long the CLI waits out an unreachable Temporal before it gives up following.",
    ),
]


WaitOpt = Annotated[
    float,
    typer.Option(
        "--unavailable-timeout",
        min=0,
        help="Seconds the CLI waits out an unreachable Temporal before it gives up.",
    ),
]

_settings = settings


def ui_link(namespace: str, workflow_id: str, run_id: str | None) -> str:
    base = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = urllib.parse.quote(workflow_id, safe="")
    return f"{base}/namespaces/{namespace}/workflows/{wid}" + (f"/{run_id}" if run_id else "")


def console_for(output: OutputFormat) -> Console:
    # In JSON mode everything human goes to stderr so stdout stays parseable.
    return SafeConsole(stderr=output == OutputFormat.json, soft_wrap=True, emoji=False)


class Runner:
    """One CLI operation: start, preview, approve, follow, report."""

    def __init__(self, workflow: str, request: OperationInput, output: OutputFormat) -> None:
        self.workflow = workflow
        self.request = request
        self.output = output
        self.console = console_for(output)
        self.workflow_id = workflow_id_for(request.project, request.workspace)
        follow = None
        if workflow == "PreviewWorkflow":
            self.workflow_id += "/preview"
            follow = "run the preview again once Temporal is back"
        self.temporal = Temporal(
            request.unavailable_timeout_seconds, request.project, request.workspace, follow
        )
        self._outcome: asyncio.Future[OperationResult] | None = None

    async def start(self) -> WorkflowHandle[Any, OperationResult]:
        client = await self.temporal.connect()
        try:
            return await self.temporal.start(
                self.workflow,
                self.request,
                id=self.workflow_id,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                result_type=OperationResult,
                static_summary=(
                    f"{self.workflow.removesuffix('Workflow').lower()} "
                    f"{self.request.project}/{self.request.workspace}"
                    + (
                        f": {len(self.request.spec.get('resources') or [])} resources"
                        if self.request.spec
                        else ""
                    )
                ),
            )
        except WorkflowAlreadyStartedError:
            raise StackLockedError(
                f"stack {self.request.project}/{self.request.workspace} already has an operation "
                f"running (workflow {self.workflow_id}); wait for it or watch it at "
                f"{ui_link(client.namespace, self.workflow_id, None)}"
            ) from None

    def outcome_of(
        self, handle: WorkflowHandle[Any, OperationResult]
    ) -> asyncio.Future[OperationResult]:
        """The run's result, awaited in the background: polling stops when the run closes.

        A run that fails before its phase moves (e.g. the stack is locked by a run under
        another workflow id) keeps answering the status query with its last phase forever.
        """
        if self._outcome is None:
            self._outcome = self.temporal.background("the run", handle.result)
        return self._outcome

    async def query_status(self, handle: WorkflowHandle[Any, OperationResult]) -> StatusView | None:
        """The run's status query, waiting out a Temporal outage; None when the run does not
        answer it (e.g. no worker holds it right now)."""
        try:
            return await self.temporal.call(
                "the run", lambda: handle.query("status", result_type=StatusView)
            )
        except RPCError:
            return None

    async def wait_for(
        self, handle: WorkflowHandle[Any, OperationResult], phases: set[str]
    ) -> StatusView:
        outcome = self.outcome_of(handle)
        while True:
            status = await self.query_status(handle)
            if isinstance(status, StatusView) and (status.phase in phases or status.phase in FINAL):
                return status
            if outcome.done():
                return status if isinstance(status, StatusView) else StatusView(phase="failed")
            await asyncio.wait({outcome}, timeout=POLL_SECONDS)

    async def result(self, handle: WorkflowHandle[Any, OperationResult]) -> OperationResult:
        try:
            return await self.outcome_of(handle)
        except WorkflowFailureError as exc:
            # The first typed application error down the chain is the one that matters; the
            # chain goes on to the engine exception it was made from (type = class name).
            chain: list[BaseException] = [exc]
            while chain[-1].__cause__ is not None:
                chain.append(chain[-1].__cause__)
            typed = [c for c in chain if isinstance(c, ApplicationError) and c.type]
            cause = typed[0] if typed else chain[-1]
            if isinstance(cause, ApplicationError) and cause.type == "StackLocked":
                raise StackLockedError(cause.message) from None
            if isinstance(cause, ApplicationError) and cause.type in BAD_INPUT_TYPES:
                from stackflow.errors import SpecError

                raise SpecError(cause.message) from None
            message = getattr(cause, "message", None) or str(cause)
            raise OperationFailed(f"{self.workflow} failed: {message}") from None

    def show_preview(self, changes: dict[str, Any], detail: bool) -> None:
        if self.output == OutputFormat.table:
            render_preview(Preview.model_validate(changes), self.console, detail=detail)

    async def update(
        self, handle: WorkflowHandle[Any, OperationResult], name: str, arg: ApprovalInput
    ) -> Any:
        """The ``name`` Update, waiting out a Temporal outage (one update id for every
        attempt, so a retried one is applied once)."""
        update_id = f"{name}-{uuid.uuid4().hex}"
        return await self.temporal.call(
            name, lambda: handle.execute_update(name, arg, id=update_id)
        )

    async def approve(self, handle: WorkflowHandle[Any, OperationResult], yes: bool) -> None:
        by = current_user()
        if yes:
            decision = True
        elif not sys.stdin.isatty():
            await self.update(
                handle, "reject", ApprovalInput(by=by, reason="no terminal to ask; pass --yes")
            )
            raise CannotAsk(
                "standard input is not a terminal, so stackflow cannot ask; pass --yes to approve"
            )
        else:
            decision = typer.confirm(
                f"Apply these changes to {self.request.project}/{self.request.workspace}?",
                default=False,
            )
        name = "approve" if decision else "reject"
        try:
            await self.update(handle, name, ApprovalInput(by=by))
        except WorkflowUpdateFailedError as exc:
            raise OperationFailed(f"{name} refused: {exc.cause or exc}") from None

    async def follow(self, handle: WorkflowHandle[Any, OperationResult]) -> None:
        """A progress bar of resources done/total with the running ones, until the end."""
        if self.output == OutputFormat.json or not self.console.is_terminal:
            await self.wait_for(handle, {PAUSED})
            return
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[running]}"),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task(self.request.project, total=None, running="", eta="")
            outcome = self.outcome_of(handle)
            while not outcome.done():
                status = await self.query_status(handle)
                if status is None:
                    await asyncio.wait({outcome}, timeout=POLL_SECONDS)
                    continue
                running = ", ".join(_short(r) for r in status.running[:2]) + (
                    f" +{len(status.running) - 2}" if len(status.running) > 2 else ""
                )
                progress.update(
                    task,
                    description=status.phase,
                    total=status.total or None,
                    completed=status.done,
                    running=running,
                    eta=eta_text(status.eta_seconds),
                )
                if status.phase in FINAL or status.phase == PAUSED:
                    return
                await asyncio.wait({outcome}, timeout=POLL_SECONDS)


def _short(resource_id: str, width: int = 40) -> str:
    """A resource id cut to ``width`` from the left (its end names the object)."""
    return resource_id if len(resource_id) <= width else "…" + resource_id[-(width - 1) :]


def eta_text(seconds: float | None) -> str:
    """``ETA 1m05s`` from the run's estimate (the rate of finished nodes), or nothing."""
    return "" if seconds is None else f"ETA {human_duration(seconds)}"


def full_changes(view: dict[str, Any]) -> dict[str, Any]:
    """The preview with the full diffs its ``diff_refs`` name, read from the state backend
    (changes without a diff keep what the run showed)."""
    from stackflow.config import default_backend
    from stackflow.diff_store import load_changes

    backend = default_backend()
    try:
        full = {c["id"]: c for c in load_changes(backend, view.get("diff_refs") or [])}
    finally:
        backend.close()
    changes = [full.get(c["id"], c) for c in view.get("changes", [])]
    shown = {c["id"] for c in changes}
    changes += [c for rid, c in full.items() if rid not in shown and c["action"] != "UnChanged"]
    return {**view, "changes": changes}


def current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _request(project: str, workspace: str, **fields: Any) -> OperationInput:
    try:
        request = OperationInput(
            project=project, workspace=workspace, operator=current_user(), **fields
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {_option_error(exc)}") from None
    check_request(request)
    return request


def _option_error(exc: ValueError) -> str:
    """``field: message`` of the first validation error, in the CLI's option names."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        name = ".".join(str(p) for p in first["loc"]) or "input"
        option = "--" + name.replace("_", "-").removesuffix("-seconds")
        return f"{option}: {first['msg']}"
    return str(exc).splitlines()[-1].strip()


def _spec_input(path: str) -> dict[str, Any]:
    """How the workflow input carries the spec: inline (``{"spec": …}``, all a client needs
    is Temporal), or, when it is over the byte budget even compressed and this machine
    shares the state backend (``STACKFLOW_STATE_URL`` set), stored there first and passed
    as ``{"spec_ref": …}``. Refused (exit 2) when it must go inline and is over Temporal's
    payload limit."""
    spec = load_spec(path)
    data = spec.model_dump(mode="json", by_alias=True)
    size = asyncio.run(encoded_size(data))
    if size > BUDGET and os.environ.get("STACKFLOW_STATE_URL"):
        from stackflow.config import default_backend

        backend = default_backend()
        try:
            return {"spec_ref": backend.put_spec(spec)}
        finally:
            backend.close()
    if size > PAYLOAD_LIMIT * 0.95:
        raise SpecError(
            f"{path}: the spec is {size / 1048576:.1f} MiB compressed, over Temporal's "
            f"{PAYLOAD_LIMIT // 1048576} MiB payload limit: split it into several stacks, "
            "or set STACKFLOW_STATE_URL so the CLI stores it in the state backend first"
        )
    return {"spec": data}


def _report(runner: Runner, result: OperationResult, run_id: str | None) -> None:
    _, namespace, _ = _settings()
    link = ui_link(namespace, runner.workflow_id, run_id)
    if runner.output == OutputFormat.json:
        data = result.model_dump(mode="json")
        data["release"] = _release_json(result)
        data["ui"] = link
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        c = runner.console
        colour = "green" if result.phase == "succeeded" else "red"
        rev = f"release {result.revision} " if result.revision is not None else ""
        c.print(
            f"[bold]{result.operation}[/] {result.project}/{result.workspace}: "
            f"{rev}[{colour}]{result.phase}[/]"
        )
        counts: dict[str, int] = {}
        for r in result.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        if counts:
            c.print("  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        failed = [r for r in result.results if r.status == "failed"]
        for r in failed if len(failed) > 1 else []:
            c.print(f"  [red]✗ {escape(r.id)}[/]: {escape(r.error or '')}")
        c.print(f"  Temporal UI: {link}")
    if result.phase == "failed":
        # One line on stderr, and the exit code of the failure's class.
        message = result.error or f"{result.operation} failed"
        if result.error_type in BAD_INPUT_TYPES:
            raise SpecError(message)
        raise OperationFailed(message)


def _release_json(result: OperationResult) -> dict[str, Any] | None:
    """The release as stored, when this machine reaches the state backend
    (``STACKFLOW_STATE_URL``); None otherwise (the run's result has the rest)."""
    if result.revision is None:
        return None
    from stackflow.config import default_backend

    try:
        backend = default_backend()
        try:
            release = backend.get(result.project, result.workspace, result.revision)
        finally:
            backend.close()
    except StackflowError:
        return None
    return masked_release_json(release)


async def _run(
    workflow: str,
    request: OperationInput,
    output: OutputFormat,
    yes: bool,
    detail: bool,
    full: bool = False,
) -> None:
    if yes and workflow != "PreviewWorkflow":
        # Approved up front: the run goes from its preview straight to the walk (the release
        # records "<user> (auto_approve)"), one round trip less than an approval Update.
        request = request.model_copy(update={"auto_approve": True})
    runner = Runner(workflow, request, output)
    handle = await runner.start()
    if workflow == "PreviewWorkflow":
        result = await runner.result(handle)
        if full:
            result.changes = full_changes(result.changes)
        if output == OutputFormat.json:
            typer.echo(json.dumps(result.changes, indent=2, sort_keys=True))
        else:
            runner.show_preview(result.changes, detail)
        return
    status = await runner.wait_for(handle, {"awaitingApproval", "applying", "destroying", PAUSED})
    outcome = runner.outcome_of(handle)
    if outcome.done() and status.phase not in FINAL:
        # The run ended before it got anywhere (e.g. stack locked): report its error.
        _report(runner, await runner.result(handle), handle.result_run_id)
        return
    if status.phase not in FINAL or status.changes.get("changes"):
        preview = await runner.temporal.call(
            "the run", lambda: handle.query("preview", result_type=dict[str, Any])
        )
        runner.show_preview(preview, detail)
    if status.phase == "awaitingApproval":
        await runner.approve(handle, yes)
    await runner.follow(handle)
    if not runner.outcome_of(handle).done():
        paused = await runner.query_status(handle)
        if paused is not None and paused.phase == PAUSED:
            raise RunPaused(
                f"{request.project}/{request.workspace} paused: {paused.failed} node(s) failed"
                + (f" ({paused.error})" if paused.error else "")
                + f"; re-run them with `stackflow retry -p {request.project} -w "
                f"{request.workspace}` or end the run with `stackflow abort -p "
                f"{request.project} -w {request.workspace}`"
            )
    result = await runner.result(handle)
    _report(runner, result, handle.result_run_id)


@app.command()
def preview(
    file: FileOpt,
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
    ignore_field: IgnoreOpt = None,
    force: ForceOpt = False,
    adopt: AdoptOpt = False,
    detail: DetailOpt = True,
    unavailable_timeout: UnavailableOpt = 600.0,
    target: TargetOpt = None,
    exclude: ExcludeOpt = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Every field and whole values, from the state backend (STACKFLOW_STATE_URL); "
            "by default long values are shortened and big diffs summarised.",
        ),
    ] = False,
) -> None:
    """Show what apply would change: desired vs live vs prior (three-way diff)."""
    request = _request(
        project,
        workspace,
        **_spec_input(file),
        ignore_fields=ignore_field or [],
        force=force,
        adopt=adopt,
        unavailable_timeout_seconds=unavailable_timeout,
        targets=target or [],
        excludes=exclude or [],
    )
    asyncio.run(_run("PreviewWorkflow", request, output, True, detail, full))


@app.command()
def apply(
    file: FileOpt,
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    max_concurrency: ConcurrencyOpt = 8,
    ignore_field: IgnoreOpt = None,
    watch: WatchOpt = False,
    fail_fast: FailFastOpt = False,
    force: ForceOpt = False,
    adopt: AdoptOpt = False,
    detail: DetailOpt = False,
    on_failure: OnFailureOpt = OnFailure.fail,
    unavailable_timeout: UnavailableOpt = 600.0,
    target: TargetOpt = None,
    exclude: ExcludeOpt = None,
) -> None:
    """Preview, ask, then apply the spec as a durable Temporal workflow."""
    request = _request(
        project,
        workspace,
        **_spec_input(file),
        max_concurrency=max_concurrency,
        ignore_fields=ignore_field or [],
        watch=watch,
        fail_fast=fail_fast,
        force=force,
        adopt=adopt,
        on_failure=on_failure.value,
        unavailable_timeout_seconds=unavailable_timeout,
        targets=target or [],
        excludes=exclude or [],
    )
    asyncio.run(_run("ApplyWorkflow", request, output, yes, detail))


@app.command()
def destroy(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    max_concurrency: ConcurrencyOpt = 8,
    fail_fast: FailFastOpt = False,
    on_failure: OnFailureOpt = OnFailure.fail,
    unavailable_timeout: UnavailableOpt = 600.0,
    target: TargetOpt = None,
    exclude: ExcludeOpt = None,
) -> None:
    """Delete everything the stack's last release holds, dependents first."""
    request = _request(
        project,
        workspace,
        max_concurrency=max_concurrency,
        fail_fast=fail_fast,
        on_failure=on_failure.value,
        unavailable_timeout_seconds=unavailable_timeout,
        targets=target or [],
        excludes=exclude or [],
    )
    asyncio.run(_run("DestroyWorkflow", request, output, yes, False))


@app.command()
def rollback(
    project: ProjectOpt,
    to: Annotated[int, typer.Option("--to", help="The release whose spec to apply again.")],
    workspace: WorkspaceOpt = "default",
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    max_concurrency: ConcurrencyOpt = 8,
    detail: DetailOpt = False,
    fail_fast: FailFastOpt = False,
    on_failure: OnFailureOpt = OnFailure.fail,
    unavailable_timeout: UnavailableOpt = 600.0,
) -> None:
    """Apply release N's spec again as a new release (operation rollback): preview, ask,
    apply, exactly as apply."""
    request = _request(
        project,
        workspace,
        to_revision=to,
        max_concurrency=max_concurrency,
        fail_fast=fail_fast,
        on_failure=on_failure.value,
        unavailable_timeout_seconds=unavailable_timeout,
    )
    asyncio.run(_run("RollbackWorkflow", request, output, yes, detail))


@app.command()
def refresh(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    yes: YesOpt = False,
    output: OutputOpt = OutputFormat.table,
    detail: DetailOpt = True,
    unavailable_timeout: UnavailableOpt = 600.0,
    target: TargetOpt = None,
    exclude: ExcludeOpt = None,
) -> None:
    """Read every recorded resource and record its live state as a new release, changing
    nothing (`tofu apply -refresh-only`): shows what it would record, asks (or --yes)."""
    request = _request(
        project,
        workspace,
        unavailable_timeout_seconds=unavailable_timeout,
        targets=target or [],
        excludes=exclude or [],
    )
    asyncio.run(_run("RefreshWorkflow", request, output, yes, detail))


@app.command()
def worker() -> None:
    """Run a worker (as `python -m stackflow.worker`): TEMPORAL_ADDRESS, STACKFLOW_TASK_QUEUE, …"""
    import stackflow.worker as worker_module

    worker_module.main()
