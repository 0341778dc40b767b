"""`stackflow apply --yes` and `stackflow destroy --yes` in API mode without the typer app
(:mod:`stackflow.cli.quick` imports this module for them only): the run started with the
request `stackflow.cli.remote.run` sends, its events taken as ``RemoteRun.on_event`` takes
them, and its end printed as ``stackflow.cli.report.report`` prints it, with its exit code.

Only the plain case: ``apply -f FILE -p P [-w W] --yes [-o table|json] [--[no-]detail]``
and ``destroy -p P [-w W] --yes [-o table|json]`` (``-y`` for ``--yes``), a table only off
a terminal (on one the typer command draws a progress bar). Anything else, and a start
the API refuses, is None before anything is printed: the typer command runs.

Once the run has started, whatever the quick path does not take as ``RemoteRun`` would (a
policy decision, an approval wait, an event or answer it does not read as it is, an
answer that is not a success) hands the same run to ``stackflow.cli.remote.resume_run``
with what was taken so far (:class:`Followed`): it reads the events after the last one
taken, prints nothing twice, and ends the command as `stackflow apply` ends it.

Imports nothing beyond the standard library until it prints (rich for tables)."""

from __future__ import annotations

import os
import sys

from stackflow.cli.quick import (
    EVENT_TYPES,
    NDJSON,
    PHASES,
    STREAM,
    echo,
    namespace,
    show_changes,
    table_console,
    ui_link,
)
from stackflow.cli.quick_args import (
    BAD_INPUT_TYPES,
    CLOSE_WAIT,
    COMMON_OPTIONS,
    HELD_TYPES,
    is_int,
    optional,
    parse_options,
    plain,
    spec_text,
    token_and_api,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported at run time (see stackflow.cli.quick)
    from typing import Any

    from stackflow.cli.quick_http import Http, NotPlain

WORKFLOWS = {"apply": "ApplyWorkflow", "destroy": "DestroyWorkflow"}
YES = {"--yes": ("yes", "yes"), "-y": ("yes", "yes")}
OPTIONS = {
    "apply": (
        {**COMMON_OPTIONS, "-f": "file", "--file": "file"},
        {**YES, "--detail": ("detail", "yes"), "--no-detail": ("detail", "no")},
    ),
    "destroy": (COMMON_OPTIONS, YES),
}
"""Each command's options and flags the quick path takes (``stackflow.cli.options``)."""
DEFAULTS = {"on_failure": "fail", "max_concurrency": 8}
"""What ``remote.run_request`` sends for apply's and destroy's default options."""
OPERATIONS = ("apply", "destroy", "rollback", "refresh", "preview", "drift")
"""``stackflow.model.release.Operation``'s values (and ``stackflow.api.models.RunOperation``'s)."""
MOVING = ("applying", "destroying")
"""``stackflow.cli.remote.MOVING``: the phases on which the preview is shown."""
CREATED_FIELDS = ("run_id", "workflow_id", "operation", "status_url", "events_url")
VIEW_TEXTS = ("error", "error_type", "requested_by", "approved_by", "message")


class Followed:
    """What the quick path took of a run's events, kept as ``RemoteRun`` keeps it, for
    ``remote.resume_run`` to go on from (``RemoteRun.take``)."""

    def __init__(self) -> None:
        self.after = 0
        """The ``seq`` of the last event taken."""
        self.ended = False
        """The stream ended (after ``run_complete``, or closed by the server), as
        ``RemoteRun.follow`` returns."""
        self.total = 0
        self.running: dict[str, None] = {}
        self.results: dict[str, dict[str, Any]] = {}
        """``NodeResult``'s fields (but ``digest``) by node id, in ``RemoteRun.results``'
        order."""
        self.counts: dict[str, int] | None = None
        self.shown = False


class HandOver(Exception):
    """Not taken as ``RemoteRun`` would take it: the typer path's code goes on."""


def run_command(command: str, args: list[str]) -> int | None:
    """`stackflow apply` or `stackflow destroy` (``command``) with ``args``: the exit code
    once answered; None: run the typer command."""
    from stackflow.cli.quick_http import Dropped, NotPlain, Unsent

    options = parse_options(args, *OPTIONS[command])
    if (
        options is None
        or options.get("yes") != "yes"
        or (command == "apply") != ("file" in options)
    ):
        return None
    if options["output"] == "table" and stdout_is_terminal():
        return None
    body: dict[str, Any] = {"operation": command}
    if command == "apply":
        text = spec_text(options["file"])
        if text is None:
            return None
        body["spec_yaml"] = text
    body.update(auto_approve=True, **DEFAULTS)
    api = token_and_api()
    if api is None:
        return None
    run = QuickRun(api, command, options)
    key = f"stackflow-cli-{os.urandom(16).hex()}"
    with api:
        try:
            created = api.post(run.runs, body, {"Idempotency-Key": key}, (200, 201))
        except Unsent:
            return None
        except Dropped:  # it may have arrived: sent again with its key, as the client does
            run.resume(start=(body, key))
            return 0
        except NotPlain as refused:
            if refused.status == 409:
                # an answer of this moment (the stack is held): final, never sent again by the
                # typer command, which would start a second run once the first has ended
                raise refusal(refused) from None
            return None  # refused: the typer command checks the spec and options first
        try:
            data = run.through(created)
        except (HandOver, NotPlain):
            data = None
    if data is None:
        run.resume(created=created)
        return 0
    run.report(data)
    return 0


def refusal(refused: NotPlain) -> Exception:
    """The error the typer command's client makes of the API's refusal (``error_for``: the
    problem's one line and its exit code, 3 for a held stack); loaded only on this path."""
    import json

    from stackflow.client.errors import error_for

    text = refused.body.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return error_for(refused.status or 0, body, text)


def stdout_is_terminal() -> bool:
    """``console_for(OutputFormat.table).is_terminal`` (rich's ``Console.is_terminal`` of
    stdout, which decides whether `stackflow apply` draws a progress bar), without rich;
    True where rich may decide otherwise (IPython)."""
    import builtins

    if hasattr(builtins, "get_ipython"):
        return True
    if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        return False if isatty is None else bool(isatty())
    except ValueError:
        return False


class QuickRun:
    """One apply or destroy through the API on the quick path, after its start."""

    def __init__(self, api: Http, command: str, options: dict[str, str]) -> None:
        self.api, self.command = api, command
        self.workflow = WORKFLOWS[command]
        self.project, self.workspace = options["project"], options["workspace"]
        self.output = options["output"]
        self.detail = options.get("detail", "no") == "yes"  # apply's --detail is off by default
        self.stack_path = f"/v1/stacks/{self.project}/{self.workspace}"
        self.runs = self.stack_path + "/runs"
        self.run = ""
        self.followed = Followed()
        self.console: Any = None

    # ---- the run ----------------------------------------------------------------------------
    def through(self, created: Any) -> dict[str, Any] | None:
        """The run ``created`` (the API's answer to its start) followed to its end: what
        `stackflow apply -o json` prints of it (:func:`result_data`, its ``release`` and
        ``ui``); None, or HandOver or NotPlain raised: ``remote.resume_run`` goes on."""
        if not (
            isinstance(created, dict)
            and all(isinstance(created.get(k), str) for k in CREATED_FIELDS)
            and created["operation"] in OPERATIONS
            and plain(created["run_id"])
        ):
            return None
        self.run = f"{self.runs}/{created['run_id']}"
        self.follow()
        view = self.final()
        changes = self.api.get(self.run + "/preview")
        if not isinstance(changes, dict):
            return None
        self.show_preview(only_changes=True, changes=changes)  # (the same answer: one request)
        followed = self.followed
        data = result_data(
            self.project, self.workspace, view, changes, followed.results, followed.counts
        )
        data["release"] = self.release(data["revision"]) if self.output == "json" else None
        data["ui"] = ui_link(namespace(), created["workflow_id"], created["run_id"])
        return data

    def follow(self) -> None:
        """The events after ``followed.after`` to ``run_complete`` (or the stream's end),
        each taken by :meth:`on_event` (``followed`` moves on only by the events taken)."""
        import json

        path = f"{self.run}/events?after={self.followed.after}"
        stream = self.api.another()  # the preview is asked for while the stream is read
        lines = (line for line in stream.lines(path, {"Accept": NDJSON}) if line.strip())
        try:
            header = json.loads(next(lines, b"null"))
            if not _header(header):
                raise HandOver("stream header")
            for line in lines:
                event = json.loads(line)
                if not _event(event):
                    raise HandOver("event")
                self.on_event(event)
                self.followed.after = event["seq"]
                if event["type"] == "run_complete":
                    break
        except ValueError:
            raise HandOver("not JSON") from None
        finally:
            lines.close()
            stream.close()
        self.followed.ended = True

    def on_event(self, event: dict[str, Any]) -> None:
        """``RemoteRun.on_event``, for the events taken as it takes them; HandOver (with
        nothing of the event taken) for the others."""
        kind, followed = event["type"], self.followed
        resource = event.get("resource")
        if resource and not isinstance(resource, dict):
            raise HandOver("resource")
        rid = (resource or {}).get("id", "")
        if kind in ("policy_decision", "approval_wait"):
            raise HandOver(kind)  # a policy (pydantic's) and the waits are the typer path's
        if kind == "run_start":
            total = event.get("total")
            if total and not is_int(total):
                raise HandOver("total")
            followed.total = total or 0
        elif kind == "apply_start":
            if not isinstance(rid, str):
                raise HandOver("resource id")
            self.show_preview()
            followed.running[rid] = None
        elif kind in ("apply_complete", "apply_errored"):
            followed.results[rid] = _node_result(rid, event, kind == "apply_errored")
            followed.running.pop(rid, None)
        elif kind == "phase":
            phase = event.get("phase")
            if isinstance(phase, dict | list):
                raise HandOver("phase")  # unhashable: RemoteRun would raise
            if phase in MOVING:
                self.show_preview()
        elif kind == "run_complete":
            counts = event.get("counts")
            if isinstance(counts, dict) and not all(is_int(n) for n in counts.values()):
                raise HandOver("counts")
            followed.counts = dict(counts) if isinstance(counts, dict) else None

    def show_preview(self, only_changes: bool = False, changes: Any = None) -> None:
        """``RemoteRun.show_preview``: the run's preview, once, for a table (``changes``:
        the preview as already read, else read now)."""
        if self.followed.shown or self.output != "table":
            return
        if changes is None:
            changes = self.api.get(self.run + "/preview")
        if not isinstance(changes, dict):
            raise HandOver("preview")
        if not (only_changes and not changes.get("changes")):
            show_changes(changes, self.table(), self.detail)
        self.followed.shown = True

    def final(self) -> dict[str, Any]:
        """``RemoteRun.final``: the run's view once it has ended (asked again while it says
        running, for at most CLOSE_WAIT); a run that did not complete raises what
        ``report.workflow_failure`` raises."""
        import time

        view = self.view()
        deadline, pause = time.monotonic() + CLOSE_WAIT, 0.05
        while view["status"] == "running" and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            view = self.view()
        if view["status"] != "completed":
            message = view.get("error") or view["status"]
            raise workflow_failure(self.workflow, message, view.get("error_type"))
        return view

    def view(self) -> dict[str, Any]:
        view = self.api.get(self.run)
        if not _run_view(view):
            raise HandOver("run view")
        result: dict[str, Any] = view
        return result

    def release(self, revision: int | None) -> Any:
        """``RemoteRun.release_of``: the release, None when there is none (404)."""
        from stackflow.cli.quick_http import NotPlain

        if revision is None:
            return None
        try:
            release = self.api.get(f"{self.stack_path}/releases/{revision}")
        except NotPlain as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(release, dict):
            raise HandOver("release")
        return release

    # ---- its end ----------------------------------------------------------------------------
    def report(self, data: dict[str, Any]) -> None:
        """``report.report``: the result as JSON or its lines, then ``raise_failure``."""
        if self.output == "json":
            import json

            echo(json.dumps(data, indent=2, sort_keys=True))
        else:
            from stackflow.cli.plain_render import render_outcome

            results = [(r["id"], r["status"], r["error"]) for r in data["results"]]
            stack = f"{self.project}/{self.workspace}"
            render_outcome(
                self.table(),
                data["operation"],
                stack,
                data["revision"],
                data["phase"],
                results,
                data["ui"],
            )
        raise_failure(data)

    def table(self) -> Any:
        """The console a run reports its table on (``runs.console_for``), made once: off a
        terminal (the quick path's only table), a PlainConsole where rich's width is known."""
        if self.console is None:
            self.console = table_console()
        return self.console

    def resume(self, created: Any = None, start: tuple[dict[str, Any], str] | None = None) -> None:
        """The typer path's code goes on with the run (``remote.resume_run``)."""
        from stackflow.cli.output import OutputFormat
        from stackflow.cli.remote import resume_run
        from stackflow.core.refs import StackRef

        resume_run(
            StackRef(self.project, self.workspace),
            self.workflow,
            OutputFormat(self.output),
            self.detail,
            created=created,
            start=start,
            followed=self.followed if created is not None else None,
        )


# ---- the answers, checked as the client's models take them ----------------------------------
TIME_FORMAT = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)?"


def _time(value: Any) -> bool:
    """A timestamp as the API writes it (``datetime.isoformat()``), which pydantic reads."""
    import re
    from datetime import datetime

    if not isinstance(value, str) or not re.fullmatch(TIME_FORMAT, value):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _header(header: Any) -> bool:
    """``client.stream.parse_header`` takes it."""
    fields = ("project", "workspace", "workflow_id", "run_id")
    return (
        isinstance(header, dict)
        and (header.get("stream"), header.get("version")) == STREAM
        and all(isinstance(header.get(k), str) for k in fields)
    )


def _event(event: Any) -> bool:
    """``client.stream.parse_event`` takes it as a ``RunEvent``."""
    return (
        isinstance(event, dict)
        and is_int(event.get("seq"))
        and event.get("type") in EVENT_TYPES
        and _time(event.get("time"))
    )


def _node_result(rid: Any, event: dict[str, Any], failed: bool) -> dict[str, Any]:
    """The ``NodeResult`` ``RemoteRun.on_event`` makes of an apply_complete/apply_errored
    event, as its fields (but ``digest``); HandOver when the model would not take it."""
    action = event.get("action")
    error, error_type = (event.get("error"), event.get("error_type")) if failed else (None, None)
    if (
        not isinstance(rid, str)
        or not (isinstance(action, str) or not action)
        or not (optional(error, str) and optional(error_type, str))
    ):
        raise HandOver("node result")
    return {
        "id": rid,
        "action": action or "",
        "status": "failed" if failed else "succeeded",
        "error": error,
        "error_type": error_type,
    }


def _run_view(view: Any) -> bool:
    """``RunView.model_validate`` takes it, and ``OperationResult`` its operation."""
    if not isinstance(view, dict) or not all(
        isinstance(view.get(k), str) for k in ("run_id", "workflow_id", "operation", "status")
    ):
        return False
    running, eta = view.get("running", []), view.get("eta_seconds")
    return (
        view["operation"] in OPERATIONS
        and (view.get("phase") is None or view.get("phase") in PHASES)
        and optional(view.get("revision"), int)
        and all(is_int(view.get(k, 0)) for k in ("total", "done", "failed"))
        and isinstance(running, list)
        and all(isinstance(r, str) for r in running)
        and isinstance(view.get("summary", {}), dict)
        and (eta is None or is_int(eta) or isinstance(eta, float))
        and all(optional(view.get(k), str) for k in VIEW_TEXTS)
        and all(view.get(k) is None or _time(view[k]) for k in ("started_at", "ended_at"))
        and optional(view.get("result"), dict)
    )


def result_data(
    project: str,
    workspace: str,
    view: dict[str, Any],
    changes: dict[str, Any],
    results: dict[str, dict[str, Any]],
    counts: dict[str, int] | None,
) -> dict[str, Any]:
    """``RemoteRun.result(view, changes).model_dump(mode="json")`` for the run's final ``view``, its
    preview ``changes``, the node ``results`` and ``counts`` its events gave (counts of
    the results by status when ``run_complete`` had none)."""
    nodes = [{**result, "digest": None} for result in results.values()]
    if counts is None:
        counts = {}
        for node in nodes:
            counts[node["status"]] = counts.get(node["status"], 0) + 1
    return {
        "project": project,
        "workspace": workspace,
        "operation": view["operation"],
        "revision": view.get("revision"),
        "phase": view.get("phase") or "failed",
        "changes": changes,
        "results": nodes,
        "error": view.get("error"),
        "error_type": view.get("error_type"),
        "counts": counts,
        "policy": None,
        "truncated": False,
    }


# ---- failures, as stackflow.cli.report raises them ------------------------------------------
def workflow_failure(workflow: str, message: str, error_type: str | None) -> Exception:
    """``report.workflow_failure``: the stack busy (exit 3), bad input (2), else 1."""
    from stackflow.core.errors import OperationFailed, SpecError, StackLockedError

    if error_type in HELD_TYPES:
        return StackLockedError(message)
    if error_type in BAD_INPUT_TYPES:
        return SpecError(message)
    return OperationFailed(f"{workflow} failed: {message}")


def raise_failure(data: dict[str, Any]) -> None:
    """``report.raise_failure`` of the result ``data``: a failed run's one line and exit
    code (raised: :func:`stackflow.cli.quick.answer` prints it as the command group does)."""
    from stackflow.core.errors import OperationFailed, SpecError, StackLockedError

    if data["phase"] == "failed":
        message = data["error"] or f"{data['operation']} failed"
        if data["error_type"] in HELD_TYPES:
            raise StackLockedError(message)
        if data["error_type"] in BAD_INPUT_TYPES:
            raise SpecError(message)
        raise OperationFailed(message)
