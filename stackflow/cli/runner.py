"""Following a run from the CLI: start its workflow (idempotently), wait for its phases
through the ``status`` query, ask for and send the approval Update, show progress, and turn
its end into an exit code."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from stackflow.cli.connection import Temporal
from stackflow.cli.output import OutputFormat
from stackflow.cli.render import render_run_preview
from stackflow.cli.report import BAD_INPUT_TYPES, HELD_TYPES
from stackflow.cli.runs import (
    CannotAsk,
    RunPaused,
    console_for,
    current_user,
    decided_elsewhere,
    four_eyes_wait,
    ui_link,
)
from stackflow.core.errors import OperationFailed, StackLockedError
from stackflow.model.release import Phase
from stackflow.temporal.operation import (
    NOT_AWAITING_APPROVAL,
    ApprovalInput,
    OperationInput,
    OperationResult,
    StatusView,
    human_duration,
    preview_workflow_id,
    workflow_id_for,
)

__all__ = [
    "FINAL",
    "PAUSED",
    "CannotAsk",
    "RunPaused",
    "Runner",
    "console_for",
    "current_user",
    "eta_text",
    "full_changes",
    "ui_link",
]

FINAL = (Phase.succeeded, Phase.failed)
PAUSED = Phase.awaitingDecision
POLL_SECONDS = 0.25
WAIT_POLLS = ((8, 0.25), (20, 0.5))
"""A wait without a progress bar asks the run's status every 0.25 s for its first 8 asks
(a small run's preview is ready within them), then every 0.5 s, and after 20 asks every
second: each ask is a query the worker answers, and a long run waited for by many CLIs (one
per stack, in CI) should not keep the worker busy answering them."""


def wait_interval(asked: int) -> float:
    """Seconds before the next status ask, after ``asked`` asks."""
    for below, seconds in WAIT_POLLS:
        if asked < below:
            return seconds
    return 1.0


class Runner:
    """One CLI operation: start, preview, approve, follow, report."""

    def __init__(self, workflow: str, request: OperationInput, output: OutputFormat) -> None:
        self.workflow = workflow
        self.request = request
        self.output = output
        self.console = console_for(output)
        self.workflow_id = workflow_id_for(request.stack)
        follow = None
        if workflow == "PreviewWorkflow":
            self.workflow_id = preview_workflow_id(request.stack)
            follow = "run the preview again once Temporal is back"
        self.temporal = Temporal(request.unavailable_timeout_seconds, request.stack, follow)
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
                    f"{self.workflow.removesuffix('Workflow').lower()} {self.request.stack}"
                    + (
                        f": {len(self.request.spec.get('resources') or [])} resources"
                        if self.request.spec
                        else ""
                    )
                ),
            )
        except WorkflowAlreadyStartedError:
            raise StackLockedError(
                f"stack {self.request.stack} already has an operation "
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
        self, handle: WorkflowHandle[Any, OperationResult], phases: set[Phase]
    ) -> StatusView:
        outcome = self.outcome_of(handle)
        asked = 0
        while True:
            status = await self.query_status(handle)
            asked += 1
            if isinstance(status, StatusView) and (status.phase in phases or status.phase in FINAL):
                return status
            if outcome.done():
                return status if isinstance(status, StatusView) else StatusView(phase=Phase.failed)
            await asyncio.wait({outcome}, timeout=wait_interval(asked))

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
            if isinstance(cause, ApplicationError) and cause.type in HELD_TYPES:
                raise StackLockedError(cause.message) from None
            if isinstance(cause, ApplicationError) and cause.type in BAD_INPUT_TYPES:
                from stackflow.core.errors import SpecError

                raise SpecError(cause.message) from None
            message = getattr(cause, "message", None) or str(cause)
            raise OperationFailed(f"{self.workflow} failed: {message}") from None

    def show_preview(self, changes: dict[str, Any], detail: bool) -> None:
        if self.output == OutputFormat.table:
            render_run_preview(changes, self.console, detail=detail)

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
                f"Apply these changes to {self.request.stack}?",
                default=False,
            )
        name = "approve" if decision else "reject"
        try:
            await self.update(handle, name, ApprovalInput(by=by))
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type == "FourEyes":
                # the worker's four-eyes policy: another approver approves; the run waits
                # for them (--yes does not skip it) and the command follows it
                typer.echo(four_eyes_wait(self.request.stack, by), err=True)
                return
            if isinstance(cause, ApplicationError) and cause.type == NOT_AWAITING_APPROVAL:
                # decided by someone else meanwhile: the run's end says how
                typer.echo(decided_elsewhere(self.request.stack, name, cause.message), err=True)
                return
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
    from stackflow.state.backend import open_backend
    from stackflow.state.diff_store import load_changes

    backend = open_backend()
    try:
        full = {c["id"]: c for c in load_changes(backend, view.get("diff_refs") or [])}
    finally:
        backend.close()
    changes = [full.get(c["id"], c) for c in view.get("changes", [])]
    shown = {c["id"] for c in changes}
    changes += [c for rid, c in full.items() if rid not in shown and c["action"] != "UnChanged"]
    return {**view, "changes": changes}
