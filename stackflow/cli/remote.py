"""The run and steering commands through the HTTP API (``STACKFLOW_API_URL``): start the run
with the same options, follow its event stream (progress, the approval wait, the end), ask
for approval, and report its end as in direct mode: the same JSON and lines, the same exit
codes."""

from __future__ import annotations

import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stackflow.api.models import RunCreated, RunOperation, RunRequest, RunView
from stackflow.cli.api_mode import api_client, not_through_api
from stackflow.cli.events import ndjson_sink, stream_api
from stackflow.cli.output import OutputFormat
from stackflow.cli.policy import local_bundle, policy_requires_approval
from stackflow.cli.quick import namespace
from stackflow.cli.render import render_run_preview
from stackflow.cli.report import BAD_INPUT_TYPES, report, workflow_failure
from stackflow.cli.runs import CannotAsk, RunPaused, console_for, four_eyes_wait, ui_link
from stackflow.client import StackflowClient
from stackflow.core.errors import NotFoundError, OperationFailed, SpecError
from stackflow.core.refs import StackRef
from stackflow.model.events import EventType, RunEvent
from stackflow.model.release import Phase
from stackflow.temporal.operation import NodeResult, OperationInput, OperationResult, StatusView

if TYPE_CHECKING:
    from stackflow.cli.quick_run import Followed

OPERATIONS = {
    "PreviewWorkflow": RunOperation.preview,
    "ApplyWorkflow": RunOperation.apply,
    "DestroyWorkflow": RunOperation.destroy,
    "RollbackWorkflow": RunOperation.rollback,
    "RefreshWorkflow": RunOperation.refresh,
}
LOCAL_ONLY = {
    "ignore_fields": "--ignore-field",
    "watch": "--watch",
    "fail_fast": "--fail-fast",
    "force": "--force",
    "adopt": "--adopt",
}
"""Options the API's run request has no field for: refused in API mode when given."""
MOVING = {Phase.applying.value, Phase.destroying.value}
CLOSE_WAIT = 30.0
"""Seconds a finished run's workflow may take to close after its last event."""


def run_request(workflow: str, request: OperationInput, yes: bool) -> RunRequest:
    """The API's request for the run ``request`` describes (checked as in direct mode)."""
    defaults = OperationInput(project=request.project, workspace=request.workspace)
    for field, option in LOCAL_ONLY.items():
        if getattr(request, field) != getattr(defaults, field):
            raise not_through_api(option)
    operation = OPERATIONS[workflow]
    fields: dict[str, Any] = {"operation": operation}
    candidates = {
        "spec": request.spec,
        "to_revision": request.to_revision,
        "targets": request.targets,
        "excludes": request.excludes,
        "on_failure": request.on_failure,
        "max_concurrency": request.max_concurrency,
        "policy": local_bundle(request.policy_ref),
    }
    from stackflow.api.models import TAKES

    for name, value in candidates.items():
        if name in TAKES[operation] and value not in (None, []):
            fields[name] = value
    if yes and "auto_approve" in TAKES[operation]:
        fields["auto_approve"] = True
    return RunRequest(**fields)


def link(created_or_view: RunCreated | RunView) -> str:
    return ui_link(namespace(), created_or_view.workflow_id, created_or_view.run_id)


class RemoteRun:
    """One run command through the API: start, follow the events, approve, report."""

    def __init__(
        self, client: StackflowClient, stack: StackRef, workflow: str, output: OutputFormat
    ) -> None:
        self.client, self.stack, self.workflow = client, stack, workflow
        self.output = output
        self.console: Console = console_for(output)
        self.results: dict[str, NodeResult] = {}
        self.needs_person: str | None = None
        self.counts: dict[str, int] | None = None
        self.total = 0
        self.running: dict[str, None] = {}
        self.shown = False
        self.run_id = ""

    def start(self, body: RunRequest) -> RunCreated:
        created = self.client.start_run(self.stack, body, f"stackflow-cli-{uuid.uuid4().hex}")
        self.run_id = created.run_id
        return created

    def show_preview(
        self, detail: bool, only_changes: bool = False, changes: dict[str, Any] | None = None
    ) -> None:
        """The run's preview, once, for a table (``changes``: as already read, else read)."""
        if self.shown or self.output != OutputFormat.table:
            return
        self.shown = True
        if changes is None:
            changes = self.client.preview(self.stack, self.run_id)
        if only_changes and not changes.get("changes"):
            return
        render_run_preview(changes, self.console, detail=detail)

    def on_event(self, event: RunEvent, yes: bool, detail: bool) -> None:
        d = event.data
        rid = (d.get("resource") or {}).get("id", "")
        if event.type == EventType.run_start:
            self.total = int(d.get("total") or 0)
        elif event.type == EventType.apply_start:
            self.show_preview(detail)
            self.running[rid] = None
        elif event.type in (EventType.apply_complete, EventType.apply_errored):
            self.running.pop(rid, None)
            failed = event.type == EventType.apply_errored
            self.results[rid] = NodeResult(
                id=rid,
                action=str(d.get("action") or ""),
                status="failed" if failed else "succeeded",
                error=d.get("error") if failed else None,
                error_type=d.get("error_type") if failed else None,
            )
        elif event.type == EventType.phase and d.get("phase") in MOVING:
            self.show_preview(detail)
        elif event.type == EventType.policy_decision:
            self.needs_person = policy_requires_approval({"policy": d})
        elif event.type == EventType.approval_wait and d.get("wait") == "approval":
            self.show_preview(detail)
            if d.get("four_eyes"):
                # another approver approves (the worker's four-eyes policy): say so, follow
                by = self.client.get_run(self.stack, self.run_id).requested_by or "you"
                typer.echo(four_eyes_wait(self.stack, by), err=True)
            elif yes and self.needs_person:
                # --yes approves for the requester; a policy asked for an approver instead.
                s = self.stack
                typer.echo(
                    f"policy requires an approver: {self.needs_person}; waiting for "
                    f"`stackflow approve -p {s.project} -w {s.workspace}`",
                    err=True,
                )
            else:
                self.approve(yes)
        elif event.type == EventType.approval_wait:
            view = self.client.get_run(self.stack, self.run_id)
            s = self.stack
            raise RunPaused(
                f"{s} paused: {view.failed} node(s) failed"
                + (f" ({view.error})" if view.error else "")
                + f"; re-run them with `stackflow retry -p {s.project} -w {s.workspace}` or "
                f"end the run with `stackflow abort -p {s.project} -w {s.workspace}`"
            )
        elif event.type == EventType.run_complete:
            counts = d.get("counts")
            self.counts = dict(counts) if isinstance(counts, dict) else None

    def approve(self, yes: bool) -> None:
        if yes:
            decision = True
        elif not sys.stdin.isatty():
            self.client.reject(self.stack, self.run_id, "no terminal to ask; pass --yes")
            raise CannotAsk(
                "standard input is not a terminal, so stackflow cannot ask; pass --yes to approve"
            )
        else:
            decision = typer.confirm(f"Apply these changes to {self.stack}?", default=False)
        self.client.step(self.stack, self.run_id, "approve" if decision else "reject")

    def follow(self, yes: bool, detail: bool, after: int = 0) -> None:
        """The events after ``after`` up to ``run_complete``, with a progress bar on a
        terminal."""
        stream = self.client.events(self.stack, self.run_id, after)
        if self.output == OutputFormat.json or not self.console.is_terminal:
            with stream:
                for event in stream:
                    self.on_event(event, yes, detail)
            return
        with (
            stream,
            Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[running]}"),
                console=self.console,
                transient=True,
            ) as progress,
        ):
            task = progress.add_task(self.stack.project, total=None, running="")
            for event in stream:
                self.on_event(event, yes, detail)
                names = list(self.running)
                progress.update(
                    task,
                    description=str(event.data.get("phase") or progress.tasks[0].description),
                    total=self.total or None,
                    completed=len(self.results),
                    running=", ".join(names[:2])
                    + (f" +{len(names) - 2}" if len(names) > 2 else ""),
                )

    def take(self, followed: Followed) -> None:
        """What :mod:`stackflow.cli.quick_run` took of the run's events, as
        :meth:`on_event` would have kept it (never a policy decision: it hands the run
        over at one, so ``needs_person`` is None)."""
        self.total, self.counts, self.shown = followed.total, followed.counts, followed.shown
        self.running = dict(followed.running)
        self.results = {rid: NodeResult(**fields) for rid, fields in followed.results.items()}

    def final(self) -> RunView:
        """The run as it ended; a run that failed as a workflow raises its error. The
        stream's ``run_complete`` is appended just before the workflow returns, so Temporal
        may say ``running`` for a moment longer: asked again, for at most CLOSE_WAIT."""
        view = self.client.get_run(self.stack, self.run_id)
        deadline = time.monotonic() + CLOSE_WAIT
        pause = 0.05
        while view.status == "running" and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            view = self.client.get_run(self.stack, self.run_id)
        if view.status != "completed":
            raise workflow_failure(self.workflow, view.error or view.status, view.error_type)
        return view

    def result(self, view: RunView, changes: dict[str, Any]) -> OperationResult:
        results = list(self.results.values())
        counts = self.counts
        if counts is None:
            counts = {}
            for r in results:
                counts[r.status] = counts.get(r.status, 0) + 1
        return OperationResult(
            project=self.stack.project,
            workspace=self.stack.workspace,
            operation=view.operation,
            revision=view.revision,
            phase=view.phase or Phase.failed,
            changes=changes,
            results=results,
            error=view.error,
            error_type=view.error_type,
            counts=counts,
        )

    def release_of(self, result: OperationResult) -> dict[str, Any] | None:
        if result.revision is None:
            return None
        try:
            return self.client.release(self.stack, result.revision)
        except NotFoundError:
            return None


def fail_if(view: RunView) -> None:
    """A run that ended with a failed result: its one line and exit code."""
    if view.phase == Phase.failed:
        message = view.error or f"{view.operation} failed"
        if view.error_type in BAD_INPUT_TYPES:
            raise SpecError(message)
        raise OperationFailed(message)


def run(
    workflow: str,
    request: OperationInput,
    output: OutputFormat | None,
    yes: bool,
    detail: bool,
    full: bool = False,
) -> None:
    """A run command through the API; ``output`` None is ``--output ndjson``."""
    if full:
        raise not_through_api("--full")
    stack = request.stack
    body = run_request(workflow, request, yes and workflow != "PreviewWorkflow")
    with api_client() as client:
        remote = RemoteRun(client, stack, workflow, output or OutputFormat.json)
        created = remote.start(body)
        if output is None:
            stream_api(client, stack, created.run_id, 0, True, ndjson_sink)
            fail_if(remote.final())
            return
        if workflow == "PreviewWorkflow":
            finish_preview(remote, output, detail)
            return
        remote.follow(yes, detail)
        finish_run(remote, created, output, detail)


def finish_run(remote: RemoteRun, created: RunCreated, output: OutputFormat, detail: bool) -> None:
    """A followed run to its end: its final view (a run that failed as a workflow raises
    its error), its preview when it has not been shown, and its report (a failed run
    raises its failure)."""
    view = remote.final()
    changes = remote.client.preview(remote.stack, remote.run_id)  # one request for both
    remote.show_preview(detail, only_changes=True, changes=changes)
    report(output, remote.console, remote.result(view, changes), link(created), remote.release_of)


def resume_run(
    stack: StackRef,
    workflow: str,
    output: OutputFormat,
    detail: bool,
    *,
    created: Any = None,
    start: tuple[dict[str, Any], str] | None = None,
    followed: Followed | None = None,
) -> None:
    """`stackflow apply|destroy --yes` from where :mod:`stackflow.cli.quick_run` left it:
    the run it started (``created``, the API's answer to its start), or its start to send
    again with the same idempotency key (``start``: the request's JSON and the key) after
    the connection dropped under it; with what it took of the run's events (``followed``:
    the events after the last one taken are read, and nothing it printed is printed
    again); then :func:`finish_run`."""
    with api_client() as client:
        remote = RemoteRun(client, stack, workflow, output)
        if start is not None:
            body, key = start
            run = client.start_run(stack, client.model(RunRequest, body), key)
        else:
            run = client.model(RunCreated, created)
        remote.run_id = run.run_id
        if followed is not None:
            remote.take(followed)
        if followed is None or not followed.ended:
            remote.follow(True, detail, followed.after if followed is not None else 0)
        finish_run(remote, run, output, detail)


def finish_preview(remote: RemoteRun, output: OutputFormat, detail: bool) -> None:
    """A started preview to its end: its events up to ``run_complete``, its final view (a
    run that failed raises its error), then its changes as JSON or a table."""
    client, stack = remote.client, remote.stack
    with client.events(stack, remote.run_id) as stream:
        for _ in stream:
            pass
    remote.final()
    changes = client.preview(stack, remote.run_id)
    if output == OutputFormat.json:
        import json

        typer.echo(json.dumps(changes, indent=2, sort_keys=True))
    else:
        render_run_preview(changes, remote.console, detail=detail)


def resume_preview(
    stack: StackRef,
    output: OutputFormat,
    detail: bool,
    created: Any = None,
    start: tuple[str, str] | None = None,
) -> None:
    """`stackflow preview` from where :mod:`stackflow.cli.quick` left it: the run it
    started (``created``, the API's answer to its start), or its start to send again with
    the same idempotency key (``start``: the spec's text and the key) after the connection
    dropped under it; then :func:`finish_preview`."""
    with api_client() as client:
        remote = RemoteRun(client, stack, "PreviewWorkflow", output)
        if start is not None:
            spec_yaml, key = start
            run = client.start_run(
                stack, RunRequest(operation=RunOperation.preview, spec_yaml=spec_yaml), key
            )
        else:
            run = client.model(RunCreated, created)
        remote.run_id = run.run_id
        finish_preview(remote, output, detail)


# ---- steering and status --------------------------------------------------------------------
def running_run(client: StackflowClient, stack: StackRef) -> RunView:
    """The stack's running operation (workflow ``stackflow/<p>/<w>``), as ``status`` finds it."""
    from stackflow.temporal.operation import workflow_id_for

    wid = workflow_id_for(stack)
    page = client.list_runs(stack, page_size=20)
    ours = [r for r in page.runs if r.workflow_id == wid]
    if not ours:
        raise NotFoundError(f"stack {stack} has no operation (workflow {wid})")
    latest = next((r for r in ours if r.status == "running"), ours[0])
    if latest.status != "running":
        raise NotFoundError(
            f"stack {stack} has no running operation (its last run is {latest.status}; "
            f"see `stackflow release list -p {stack.project} -w {stack.workspace}`)"
        )
    return client.get_run(stack, latest.run_id)


def steer(stack: StackRef, action: str, reason: str | None) -> str:
    """``approve``/``reject``/``retry``/``abort``/``cancel`` the running operation: what the
    Update answered (cancel: the workflow id)."""
    with api_client() as client:
        view = running_run(client, stack)
        step = client.step(stack, view.run_id, action, reason)
    return step.workflow_id if action == "cancel" else step.result


def status(stack: StackRef) -> tuple[StatusView, str]:
    with api_client() as client:
        view = running_run(client, stack)
    if view.phase is None:
        raise OperationFailed(view.error or f"the run of {stack} did not answer the status query")
    status = StatusView(
        phase=view.phase,
        revision=view.revision,
        total=view.total,
        done=view.done,
        failed=view.failed,
        running=view.running,
        changes={"summary": view.summary} if view.summary else {},
        error=view.error,
        eta_seconds=view.eta_seconds,
    )
    return status, ui_link(namespace(), view.workflow_id, None)
