"""The run and steering commands, through the API (`stackflow serve` at ``STACKFLOW_API_URL``,
or the API in this process): start the run, follow its event stream (progress, the approval
wait, the end), ask for approval, report its end. The typed client is the only transport;
nothing here imports pydantic, typer or the engine but to say why a spec or an option is
refused, in the words of the CLI's options."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from stackflow.cli.api_mode import api_client, api_mode, not_through_api
from stackflow.cli.output import OutputFormat, echo
from stackflow.cli.report import raise_failure, report, result_data, workflow_failure
from stackflow.cli.runs import (
    CannotAsk,
    RunPaused,
    decided_elsewhere,
    four_eyes_wait,
    namespace,
    run_console,
    ui_link,
)
from stackflow.cli.views import show_changes
from stackflow.client import EventStream, StackflowClient
from stackflow.client.errors import (
    NOT_AWAITING_APPROVAL,
    ApiConflict,
    ApiInvalid,
    ApiNotFound,
    ApiUnavailable,
)
from stackflow.client.types import (
    MAX_SPEC_BYTES,
    TAKES,
    WORKFLOWS,
    RunEvent,
    RunOperation,
    RunView,
    Stack,
)
from stackflow.core.errors import NotFoundError, OperationFailed
from stackflow.core.terminal import human_duration

OPERATIONS = {workflow: operation for operation, workflow in WORKFLOWS.items()}
MOVING = {"applying", "destroying"}
QUIET = 5.0
"""Seconds without an event before a run command asks for the run's view."""
CLOSE_WAIT = 30.0
"""Seconds a finished run's workflow may take to close after its last event."""
FLAGS = {
    "max_concurrency": "--max-concurrency",
    "targets": "--target",
    "excludes": "--exclude",
    "ignore_fields": "--ignore-field",
    "unavailable_timeout_seconds": "--unavailable-timeout",
    "to_revision": "--to",
    "on_failure": "--on-failure",
    "path.project": "--project",
    "path.workspace": "--workspace",
}
"""The run request's fields as the options that set them, for the API's refusals."""


def spec_text(path: str) -> str:
    """The spec file's text as the API's ``spec_yaml`` takes it (``-``: standard input, as
    UTF-8 whatever the locale); what the engine cannot read either is its error."""
    data = b""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_size > MAX_SPEC_BYTES:
                    raise ValueError(path)
                data = file.read(MAX_SPEC_BYTES + 1)
        text = data.decode("utf-8")
        if text.startswith("\ufeff") or len(data) > MAX_SPEC_BYTES:
            raise ValueError(path)
        return text
    except (OSError, ValueError):
        from stackflow.engine.spec import load_spec, parse_spec_text

        if path == "-":
            parse_spec_text(data, "<stdin>")
        else:
            load_spec(path)  # raises what is wrong with it
        raise


def spec_source(path: str) -> str:
    """How the engine names the spec in its messages."""
    from pathlib import Path

    return "<stdin>" if path == "-" else str(Path(path))


def run_request(workflow: str, o: dict[str, Any], yes: bool) -> dict[str, Any]:
    """The API's request (its JSON) for the run the options describe."""
    text = spec_text(o["file"]) if o.get("file") else None
    if o.get("full") and api_mode():
        raise not_through_api("--full")
    operation = OPERATIONS[workflow]
    takes = TAKES[operation]
    body: dict[str, Any] = {"operation": operation.value}
    candidates = {
        "spec_yaml": text,
        "to_revision": o.get("to"),
        "targets": o.get("target") or None,
        "excludes": o.get("exclude") or None,
        "on_failure": o.get("on_failure"),
        "max_concurrency": o.get("max_concurrency"),
        "fail_fast": o.get("fail_fast") or None,
        "ignore_fields": o.get("ignore_field") or None,
        "watch": o.get("watch") or None,
        "force": o.get("force") or None,
        "adopt": o.get("adopt") or None,
        "unavailable_timeout_seconds": o.get("unavailable_timeout"),
    }
    for name, value in candidates.items():
        if name in takes and value is not None:
            body[name] = value
    if o.get("policy"):
        from stackflow.policy_gate.bundle import load_bundle_dir

        bundle = load_bundle_dir(o["policy"])
        body["policy"] = bundle.model_dump(mode="json", exclude_unset=True)
    if yes and "auto_approve" in takes:
        body["auto_approve"] = True
    return body


def start(client: StackflowClient, stack: Stack, body: dict[str, Any], path: str) -> Any:
    """Start the run; a spec the API refuses is read by the engine, for the message naming the
    file (the API's own when the engine takes it); a refused field is named as its option."""
    try:
        return client.start_run(stack, body, f"stackflow-cli-{os.urandom(16).hex()}")
    except ApiInvalid as exc:
        if "spec_yaml" in body:
            from stackflow.engine.spec import parse_spec_text

            parse_spec_text(body["spec_yaml"], spec_source(path))
        detail = exc.detail.removeprefix("invalid option: ")
        field, sep, rest = detail.partition(":")
        key = field if field in FLAGS else field.split(".")[0]  # ignore_fields.0: its option
        if sep and key in FLAGS:
            raise ApiInvalid(f"invalid option: {FLAGS[key]}:{rest}", exc.status, exc.kind) from None
        raise


class RemoteRun:
    """One run command through the API: start, follow the events, approve, report."""

    def __init__(
        self, client: StackflowClient, stack: Stack, workflow: str, output: OutputFormat
    ) -> None:
        self.client, self.stack, self.workflow = client, stack, workflow
        self.output = output
        self.console: Any = run_console(output)
        self.results: dict[str, dict[str, Any]] = {}
        self.needs_person: str | None = None
        self.counts: dict[str, int] | None = None
        self.total = 0
        self.running: dict[str, None] = {}
        self.shown = False
        self.run_id = ""

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
        show_changes(changes, self.console, detail)

    def show_early(self, detail: bool) -> None:
        """The preview as the run starts to change things, on a terminal (above the progress
        bar): off one, nothing is drawn meanwhile, so it is shown with the run's end, from
        the result already read, not asked of the running workflow (a query: a task on the
        worker and on Temporal for each run)."""
        if self.console.is_terminal:
            self.show_preview(detail)

    def on_event(self, event: RunEvent, yes: bool, detail: bool) -> None:
        d = event.data
        rid = (d.get("resource") or {}).get("id", "")
        kind = event.type
        if kind == "run_start":
            self.total = int(d.get("total") or 0)
        elif kind == "apply_start":
            self.show_early(detail)
            self.running[rid] = None
        elif kind in ("apply_complete", "apply_errored"):
            self.running.pop(rid, None)
            failed = kind == "apply_errored"
            self.results[rid] = {
                "id": rid,
                "action": str(d.get("action") or ""),
                "status": "failed" if failed else "succeeded",
                "error": d.get("error") if failed else None,
                "error_type": d.get("error_type") if failed else None,
                "digest": None,
            }
        elif kind == "phase" and d.get("phase") in MOVING:
            self.show_early(detail)
        elif kind == "policy_decision":
            from stackflow.cli.runs import policy_requires_approval

            self.needs_person = policy_requires_approval({"policy": d})
        elif kind == "approval_wait" and d.get("wait") == "approval":
            self.show_preview(detail)
            if d.get("four_eyes"):
                # another approver approves (the worker's four-eyes policy): say so, follow
                by = self.client.get_run(self.stack, self.run_id).requested_by or "you"
                echo(four_eyes_wait(self.stack, by), err=True)
            elif yes and self.needs_person:
                # --yes approves for the requester; a policy asked for an approver instead.
                s = self.stack
                echo(
                    f"policy requires an approver: {self.needs_person}; waiting for "
                    f"`stackflow approve -p {s.project} -w {s.workspace}`",
                    err=True,
                )
            else:
                self.approve(yes)
        elif kind == "approval_wait":
            view = self.client.get_run(self.stack, self.run_id)
            s = self.stack
            raise RunPaused(
                f"{s} paused: {view.failed} node(s) failed"
                + (f" ({view.error})" if view.error else "")
                + f"; re-run them with `stackflow retry -p {s.project} -w {s.workspace}` or "
                f"end the run with `stackflow abort -p {s.project} -w {s.workspace}`"
            )
        elif kind == "run_complete":
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
            import typer

            decision = typer.confirm(f"Apply these changes to {self.stack}?", default=False)
        action = "approve" if decision else "reject"
        try:
            self.client.step(self.stack, self.run_id, action)
        except ApiConflict as exc:
            if exc.kind != NOT_AWAITING_APPROVAL:
                raise
            # decided by someone else meanwhile: the run's end says how
            echo(decided_elsewhere(self.stack, action, exc.detail), err=True)

    def events(self, stream: EventStream) -> Iterator[RunEvent]:
        """The stream's events, read on a thread of their own; after each ``QUIET`` seconds
        without one the run's view is asked for, through the API: a Temporal outage is seen
        there and waited out (``--unavailable-timeout``, said on a terminal), or ends the
        command saying that the run goes on. A quiet stream never waits for ever."""
        found: queue.Queue[Any] = queue.Queue()

        def pump() -> None:
            try:
                for event in stream:
                    found.put(event)
            except BaseException as exc:  # raised here, in the command's thread
                found.put(exc)
            found.put(None)

        threading.Thread(target=pump, name="run-events", daemon=True).start()
        while True:
            try:
                item = found.get(timeout=QUIET)
            except queue.Empty:
                self.client.get_run(self.stack, self.run_id)
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def follow(self, yes: bool, detail: bool) -> None:
        """The events up to ``run_complete``, with a progress bar on a terminal."""
        stream = self.client.events(self.stack, self.run_id)
        if self.output == OutputFormat.json or not self.console.is_terminal:
            with stream:
                for event in self.events(stream):
                    self.on_event(event, yes, detail)
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with (
            stream,
            Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.fields[running]}"),
                console=self.console,
                transient=True,
            ) as progress,
        ):
            task = progress.add_task(self.stack.project, total=None, running="", eta="")
            walking: float | None = None
            for event in self.events(stream):
                self.on_event(event, yes, detail)
                names, done = list(self.running), len(self.results)
                if walking is None and event.type == "apply_start":
                    walking = time.monotonic()
                eta = ""  # from the rate of finished nodes, as the run's status estimates it
                if walking is not None and 0 < done < self.total:
                    left = (time.monotonic() - walking) / done * (self.total - done)
                    eta = f"ETA {human_duration(left)}"
                progress.update(
                    task,
                    description=str(event.data.get("phase") or progress.tasks[0].description),
                    total=self.total or None,
                    completed=done,
                    eta=eta,
                    running=", ".join(names[:2])
                    + (f" +{len(names) - 2}" if len(names) > 2 else ""),
                )

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

    def release_of(self, revision: int | None) -> dict[str, Any] | None:
        if revision is None:
            return None
        try:
            return self.client.release(self.stack, revision)
        except ApiNotFound:
            return None


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


def link(workflow_id: str, run_id: str | None) -> str:
    return ui_link(namespace(), workflow_id, run_id)


def run(workflow: str, o: dict[str, Any]) -> None:
    """A run command through the API; ``--output ndjson`` prints its event stream."""
    stack = Stack(o["project"], o["workspace"])
    yes = bool(o.get("yes")) or workflow == "PreviewWorkflow"
    detail = bool(o.get("detail"))
    body = run_request(workflow, o, yes and workflow != "PreviewWorkflow")
    output = OutputFormat.json if o["output"] == "ndjson" else OutputFormat(o["output"])
    with api_client(o["unavailable_timeout"]) as client:
        remote = RemoteRun(client, stack, workflow, output)
        created = start(client, stack, body, o.get("file") or "")
        remote.run_id = created.run_id
        try:
            follow(remote, o, yes, detail, link(created.workflow_id, created.run_id))
        except ApiUnavailable as exc:
            if exc.status != 503:
                raise
            raise ApiUnavailable(
                f"{exc.detail}; the run continues on the server: follow it with `stackflow "
                f"status {stack.cli_flags}` once Temporal is back",
                exc.status,
                exc.kind,
            ) from None


def follow(remote: RemoteRun, o: dict[str, Any], yes: bool, detail: bool, ui: str) -> None:
    """A started run to its end, reported as ``--output`` says."""
    client, stack, workflow, output = remote.client, remote.stack, remote.workflow, remote.output
    if o["output"] == "ndjson":
        from stackflow.cli.event_lines import ndjson_sink, stream_api

        stream_api(client, stack, remote.run_id, 0, True, ndjson_sink)
        raise_failure(vars(remote.final()))
        return
    if workflow == "PreviewWorkflow":
        finish_preview(remote, output, detail, bool(o.get("full")))
        return
    remote.follow(yes, detail)
    view = remote.final()
    changes = client.preview(stack, remote.run_id)  # one request for both
    remote.show_preview(detail, only_changes=True, changes=changes)
    results = list(remote.results.values())
    data = result_data(stack, view, changes, results, remote.counts)
    report(
        output,
        remote.console,
        data,
        ui,
        remote.release_of if output == OutputFormat.json else (lambda _: None),
    )


def finish_preview(remote: RemoteRun, output: OutputFormat, detail: bool, full: bool) -> None:
    """A started preview to its end: its events up to ``run_complete``, its final view (a
    run that failed raises its error), then its changes as JSON or a table (``full``: with
    the full diffs from the state backend, this machine's)."""
    client, stack = remote.client, remote.stack
    with client.events(stack, remote.run_id) as stream:
        for _ in stream:
            pass
    remote.final()
    changes = client.preview(stack, remote.run_id)
    if full:
        changes = full_changes(changes)
    if output == OutputFormat.json:
        import json

        echo(json.dumps(changes, indent=2, sort_keys=True))
    else:
        show_changes(changes, remote.console, detail)


# ---- steering and status --------------------------------------------------------------------
def running_run(client: StackflowClient, stack: Stack) -> RunView:
    """The stack's running operation (workflow ``stackflow/<p>/<w>``), as ``status`` finds it."""
    wid = f"stackflow/{stack.project}/{stack.workspace}"
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


def steer(project: str, workspace: str, action: str, reason: str | None, patience: float) -> str:
    """``approve``/``reject``/``retry``/``abort``/``cancel`` the running operation: what the
    Update answered (cancel: the workflow id)."""
    stack = Stack(project, workspace)
    with api_client(patience) as client:
        view = running_run(client, stack)
        step = client.step(stack, view.run_id, action, reason)
    return step.workflow_id if action == "cancel" else step.result


def status(project: str, workspace: str, patience: float) -> tuple[dict[str, Any], str]:
    """The running operation's ``StatusView`` JSON and its UI link."""
    stack = Stack(project, workspace)
    with api_client(patience) as client:
        view = running_run(client, stack)
    if view.phase is None:
        raise OperationFailed(view.error or f"the run of {stack} did not answer the status query")
    data = {
        "phase": view.phase,
        "revision": view.revision,
        "total": view.total,
        "done": view.done,
        "failed": view.failed,
        "running": view.running,
        "changes": {"summary": view.summary} if view.summary else {},
        "error": view.error,
        "eta_seconds": view.eta_seconds,
    }
    return data, link(view.workflow_id, None)


__all__ = ["RemoteRun", "RunOperation", "run", "status", "steer"]
