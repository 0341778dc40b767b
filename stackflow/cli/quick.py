"""Answers `stackflow` gives without its typer app, so they start as fast as Python does:
the top-level help (from the static table of :mod:`stackflow.cli.commands`), and in API
mode (``STACKFLOW_API_URL``) `stackflow status` and `stackflow preview`, which talk to the
HTTP API with the standard library (:mod:`stackflow.cli.quick_http`) and print what the
typer commands print, and `stackflow apply --yes` and `stackflow destroy --yes`
(:mod:`stackflow.cli.quick_run`, imported for them only).

Only the plain case is answered here, and :func:`answer` returns None for anything else
(another option, an unusual value, a proxy, an answer of the API that is not a success, …):
the typer app then runs the command as always, with its own checks, messages and exit
codes. Nothing is printed before that decision, and nothing is changed before it but for a
run's start, which the API refuses (4xx) for whatever the typer command would refuse
itself first (an invalid spec or option). Once a run has started, anything unusual hands
it to ``stackflow.cli.remote.resume_preview`` (or ``resume_run``), which follows it as the
typer command does.

Imports nothing beyond the standard library until it prints (rich for tables)."""

from __future__ import annotations

import os
import sys

from stackflow.cli.commands import render_help
from stackflow.cli.quick_args import (
    CLOSE_WAIT,
    COMMANDS,
    PREVIEW_FLAGS,
    PREVIEW_OPTIONS,
    RUN_FIELDS,
    STATUS_OPTIONS,
    URL_ENV,
    is_int,
    optional,
    parse_options,
    plain,
    spec_text,
    token_and_api,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported at run time: ``typing`` alone costs a third of a fast answer
    from collections.abc import Mapping
    from typing import Any

    from stackflow.cli.quick_http import Http

PHASES = (
    "generating",
    "previewing",
    "awaitingApproval",
    "applying",
    "awaitingDecision",
    "destroying",
    "succeeded",
    "failed",
)
"""``stackflow.model.release.Phase``'s values (a unit test keeps these tables equal to the
engine's)."""
ACTIONS = ("Create", "Update", "Delete", "UnChanged")
"""``stackflow.engine.diff.Action``'s values."""
EVENT_TYPES = (
    "run_start",
    "phase",
    "planned_change",
    "change_summary",
    "approval_wait",
    "policy_decision",
    "apply_start",
    "apply_complete",
    "apply_errored",
    "run_complete",
)
"""``stackflow.model.events.EventType``'s values."""
STREAM = ("stackflow.events", 1)
"""``stackflow.model.events.STREAM_NAME`` and ``STREAM_VERSION``."""
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def answer(argv: list[str]) -> int | None:
    """The exit code once the invocation ``argv`` is answered; None: run the typer app."""
    if not argv or argv == ["--help"]:
        try:
            sys.stdout.write(render_help())
            sys.stdout.flush()
        except BrokenPipeError:
            return 1  # as typer ends on a closed pipe
        return 0 if argv else 2  # no arguments: the help, as a usage error (typer's exit 2)
    if argv[0] not in COMMANDS or not os.environ.get(URL_ENV, "").strip():
        return None
    try:
        return _command(argv[0], argv[1:])
    except KeyboardInterrupt:
        return 130  # as typer exits on ^C
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Exception as exc:  # as the command group turns it into one line and an exit code
        from stackflow.core.errors import StackflowError

        err: StackflowError | None = exc if isinstance(exc, StackflowError) else None
        if err is None:  # ``one_line_error`` takes a StackflowError as it is: typer not needed
            from stackflow.cli.app import one_line_error

            err = one_line_error(exc)
        if err is None:
            raise
        from stackflow.cli.output import error_line

        error_line(str(err))
        return err.exit_code


def _command(name: str, args: list[str]) -> int | None:
    """The quick answer of command ``name`` (one of :data:`COMMANDS`) to ``args``."""
    if name in ("apply", "destroy"):
        from stackflow.cli.quick_run import run_command

        return run_command(name, args)
    return status(args) if name == "status" else preview(args)


# ---- the API's answers, checked as the client's models would take them -----------------------
def _runs(page: Any) -> list[dict[str, Any]] | None:
    """The runs of a ``GET …/runs`` page, if every one has the fields the status uses."""
    if not isinstance(page, dict) or not isinstance(page.get("runs"), list):
        return None
    runs: list[dict[str, Any]] = page["runs"]
    for run in runs:
        if not isinstance(run, dict) or not all(isinstance(run.get(k), str) for k in RUN_FIELDS):
            return None
    return runs


def _status_data(view: Any) -> dict[str, Any] | None:
    """``StatusView(...).model_dump(mode="json")`` of a ``GET …/runs/{id}`` answer (as
    ``remote.status`` builds it), if the answer has the fields' types exactly."""
    if not isinstance(view, dict) or not all(isinstance(view.get(k), str) for k in RUN_FIELDS):
        return None
    phase, eta = view.get("phase"), view.get("eta_seconds", None)
    running, summary = view.get("running", []), view.get("summary", {})
    if (
        not (phase is None or phase in PHASES)
        or not optional(view.get("revision"), int)
        or not all(is_int(view.get(key, 0)) for key in ("total", "done", "failed"))
        or not (isinstance(running, list) and all(isinstance(r, str) for r in running))
        or not isinstance(summary, dict)
        or not optional(view.get("error"), str)
        or not (eta is None or is_int(eta) or isinstance(eta, float))
        or (isinstance(eta, float) and not abs(eta) < float("inf"))
    ):
        return None
    return {
        "phase": phase,
        "revision": view.get("revision"),
        "total": view.get("total", 0),
        "done": view.get("done", 0),
        "failed": view.get("failed", 0),
        "running": running,
        "changes": {"summary": summary} if summary else {},
        "error": view.get("error"),
        "eta_seconds": None if eta is None else float(eta),
    }


def preview_parts(
    view: Any,
) -> tuple[list[dict[str, Any]], dict[str, int], bool, dict[str, Any] | None] | None:
    """A run's preview view as ``stackflow.engine.diff.Preview.model_validate`` reads it, in the
    arguments of ``stackflow.cli.render.render_changes`` (changes, summary, truncated,
    left_out), if the view has its fields' types exactly; None otherwise."""
    if not isinstance(view, dict) or "totals" in view:
        return None
    totals, changes = view.get("summary"), view.get("changes", [])
    truncated, left_out = view.get("truncated", False), view.get("left_out")
    if (
        not (totals is None or isinstance(totals, dict))
        or not isinstance(changes, list)
        or not isinstance(truncated, bool)
        or not (left_out is None or isinstance(left_out, dict))
        or not (totals is None or all(is_int(v) for v in totals.values()))
    ):
        return None
    parts: list[dict[str, Any]] = []
    for change in changes:
        if not isinstance(change, dict):
            return None
        drift, diff = change.get("drift", False), change.get("diff", [])
        if (
            not isinstance(change.get("id"), str)
            or not isinstance(change.get("type"), str)
            or change.get("action") not in ACTIONS
            or not isinstance(drift, bool)
            or not isinstance(diff, list)
            or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in diff)
        ):
            return None
        fields = [{"path": f["path"], "old": f.get("old"), "new": f.get("new")} for f in diff]
        parts.append(
            {
                "id": change["id"],
                "type": change["type"],
                "action": change["action"],
                "drift": drift,
                "diff": fields,
            }
        )
    counts = dict.fromkeys(ACTIONS, 0)
    if totals is not None:
        counts.update({k: v for k, v in totals.items() if k in counts})
    else:
        for change in parts:
            counts[change["action"]] += 1
    return parts, counts, truncated, left_out


# ---- status ----------------------------------------------------------------------------------
def status(args: list[str]) -> int | None:
    """`stackflow status` through the API: the stack's running operation, as
    ``remote.status`` finds it (the newest page of the stack's runs, then the run)."""
    from stackflow.cli.quick_http import NotPlain

    options = parse_options(args, STATUS_OPTIONS)
    if options is None:
        return None
    timeout = options.get("timeout", "0")  # not used through the API, but checked (>= 0)
    if not timeout.replace(".", "", 1).isdigit() or not timeout.isascii():
        return None
    api = token_and_api()
    if api is None:
        return None
    project, workspace = options["project"], options["workspace"]
    stack, wid = f"{project}/{workspace}", f"stackflow/{project}/{workspace}"
    path = f"/v1/stacks/{project}/{workspace}/runs"
    with api:
        try:
            runs = _runs(api.get(path + "?page_size=20"))
            if runs is None:
                return None
            ours = [r for r in runs if r["workflow_id"] == wid]
            if not ours:
                return _fail("not found", f"stack {stack} has no operation (workflow {wid})")
            latest = next((r for r in ours if r["status"] == "running"), ours[0])
            if latest["status"] != "running":
                return _fail(
                    "not found",
                    f"stack {stack} has no running operation (its last run is "
                    f"{latest['status']}; see `stackflow release list -p {project} -w "
                    f"{workspace}`)",
                )
            if not plain(latest["run_id"]):
                return None
            view = api.get(f"{path}/{latest['run_id']}")
        except NotPlain:
            return None
    data = _status_data(view)
    if data is None:
        return None
    if data["phase"] is None:
        return _fail(
            "failed", view.get("error") or f"the run of {stack} did not answer the status query"
        )
    print_status(data, ui_link(namespace(), view["workflow_id"], None), options["output"])
    return 0


def _fail(kind: str, message: str) -> int:
    """One red line on stderr, as the typer app prints a NotFoundError or OperationFailed."""
    from stackflow.cli.output import error_line
    from stackflow.core.errors import NotFoundError, OperationFailed, StackflowError

    err: StackflowError = (
        NotFoundError(message) if kind == "not found" else OperationFailed(message)
    )
    error_line(str(err))
    return err.exit_code


# ---- preview ---------------------------------------------------------------------------------
def preview(args: list[str]) -> int | None:
    """`stackflow preview -f FILE -p P [-w W] [-o table|json] [--[no-]detail]` through the
    API: start the preview with the spec's text (``spec_yaml``: the API reads it as the CLI
    reads the file), follow its events to ``run_complete``, wait for its end, and print its
    changes as `stackflow preview` does."""
    from stackflow.cli.quick_http import Dropped, NotPlain, Unsent

    options = parse_options(args, PREVIEW_OPTIONS, PREVIEW_FLAGS)
    if options is None or "file" not in options:
        return None
    text = spec_text(options["file"])
    api = token_and_api() if text is not None else None
    if api is None or text is None:
        return None
    output, detail = options["output"], options.get("detail", "yes") == "yes"
    project, workspace = options["project"], options["workspace"]
    path = f"/v1/stacks/{project}/{workspace}/runs"
    key = f"stackflow-cli-{os.urandom(16).hex()}"
    body = {"operation": "preview", "spec_yaml": text}
    with api:
        try:
            created = api.post(path, body, {"Idempotency-Key": key}, (200, 201))
        except Unsent:
            return None
        except Dropped:  # it may have arrived: sent again with its key, as the client does
            _resume(project, workspace, output, detail, start=(text, key))
            return 0
        except NotPlain:  # refused: the typer command checks the spec and options first
            return None
        run_id = created.get("run_id") if isinstance(created, dict) else None
        if not isinstance(run_id, str) or not plain(run_id):
            _resume(project, workspace, output, detail, created=created)
            return 0
        try:
            changes = _follow_preview(api, f"{path}/{run_id}")
        except NotPlain:
            changes = None
    if changes is None:
        _resume(project, workspace, output, detail, created=created)
        return 0
    if output == "json":
        import json

        echo(json.dumps(changes, indent=2, sort_keys=True))
        return 0
    show_changes(changes, table_console(), detail)
    return 0


def rich_console() -> Any:
    """``runs.console_for(OutputFormat.table)``."""
    from stackflow.cli.output import OutputFormat
    from stackflow.cli.runs import console_for

    return console_for(OutputFormat.table)


def table_console() -> Any:
    """The console a table goes to (``runs.console_for``): off a terminal, a PlainConsole
    where rich's width is known (rich is imported only for what it lays out)."""
    from stackflow.cli.plain_render import PlainConsole

    width = console_width(sys.stdout)
    return rich_console() if width is None else PlainConsole(width, rich_console)


def show_changes(changes: dict[str, Any], console: Any, detail: bool) -> None:
    """``stackflow.cli.render.render_run_preview(changes, console, detail=detail)``: a run's
    preview view drawn from its plain data when :func:`preview_parts` reads it (without
    the engine's models), else by that function."""
    parts = preview_parts(changes)
    if getattr(console, "plain", False):  # a PlainConsole: rich only for what it lays out
        # ``detail`` adds the fields of each change that has some: none, nothing added
        detailed = detail and parts is not None and any_details(parts[0])
        if parts is not None and not detailed and not changes.get("policy"):
            from stackflow.cli.plain_render import plain_changes

            text = plain_changes(*parts, console.width)
            if text is not None:
                console.out(text)
                return
        console = console.rich
    from stackflow.cli.render import render_changes, render_policy, render_run_preview

    if parts is None:
        render_run_preview(changes, console, detail=detail)
        return
    render_changes(*parts, console, detail)
    if changes.get("policy"):
        render_policy(changes["policy"], console)


def any_details(changes: list[dict[str, Any]]) -> bool:
    """Whether ``render_changes(..., detail=True)`` prints fields below the table: those
    of a change that is not UnChanged and has any."""
    return any(change["action"] != "UnChanged" and change["diff"] for change in changes)


def _follow_preview(api: Http, run: str) -> dict[str, Any] | None:
    """The preview's changes once it has ended as it should (``remote.finish_preview``'s
    events, final view and preview); None when it did not (the typer path says why)."""
    import json
    import time

    lines = (line for line in api.lines(run + "/events?after=0", {"Accept": NDJSON}) if line)
    try:
        header = json.loads(next(lines))
        if not isinstance(header, dict) or (header.get("stream"), header.get("version")) != STREAM:
            return None
        for line in lines:
            event = json.loads(line)
            if (
                not isinstance(event, dict)
                or not is_int(event.get("seq"))
                or event.get("type") not in EVENT_TYPES
                or not isinstance(event.get("time"), str)
            ):
                return None
            if event["type"] == "run_complete":
                break
    except (StopIteration, ValueError):
        return None
    finally:
        lines.close()
    view = api.get(run)
    deadline, pause = time.monotonic() + CLOSE_WAIT, 0.05
    while isinstance(view, dict) and view.get("status") == "running":
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
        view = api.get(run)
    if not isinstance(view, dict) or view.get("status") != "completed":
        return None
    changes = api.get(run + "/preview")
    return changes if isinstance(changes, dict) else None


def _resume(
    project: str,
    workspace: str,
    output: str,
    detail: bool,
    created: Any = None,
    start: tuple[str, str] | None = None,
) -> None:
    from stackflow.cli.output import OutputFormat
    from stackflow.cli.remote import resume_preview
    from stackflow.core.refs import StackRef

    stack = StackRef(project, workspace)
    resume_preview(stack, OutputFormat(output), detail, created=created, start=start)


NDJSON = "application/x-ndjson"


# ---- output ----------------------------------------------------------------------------------
def namespace() -> str:
    """The Temporal namespace the UI links name (``temporal_client.settings``'s)."""
    return os.environ.get("TEMPORAL_NAMESPACE", "default")


def ui_link(namespace: str, workflow_id: str, run_id: str | None) -> str:
    """The run's page in the Temporal UI (``STACKFLOW_TEMPORAL_UI``)."""
    base = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = quote(workflow_id)
    return f"{base}/namespaces/{namespace}/workflows/{wid}" + (f"/{run_id}" if run_id else "")


def echo(text: str) -> None:
    """``typer.echo(text)`` of plain text: the line, flushed (a closed pipe raises here)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def quote(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``: every byte of its UTF-8 but letters, digits
    and ``_.-~`` percent-encoded (without importing urllib)."""
    return "".join(c if c in UNRESERVED else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def print_status(data: Mapping[str, Any], link: str, output: str) -> None:
    """What `stackflow status` prints for a run's status view (``StatusView``'s JSON):
    the view and its UI link as JSON, or a table."""
    if output == "json":
        import json

        echo(json.dumps({**data, "ui": link}, indent=2, sort_keys=True))
        return
    rows = [
        ("phase", str(data["phase"])),
        ("release", str(data["revision"]) if data["revision"] is not None else "-"),
        ("done", f"{data['done']}/{data['total']}, {data['failed']} failed"),
    ]
    if data["running"]:
        rows.append(("running", ", ".join(data["running"][:5])))
    if data["error"]:
        rows.append(("error", str(data["error"])))
    rows.append(("ui", link))
    text = plain_table(rows, console_width(sys.stdout))
    if text is not None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # as rich's Console.on_broken_pipe: exit 1, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        return
    from rich.table import Table

    from stackflow.cli.output import stdout_console

    table = Table(show_header=False)
    for row in rows:
        table.add_row(*row)
    stdout_console().print(table)


def console_width(stream: Any) -> int | None:
    """The width rich gives a console on ``stream`` (``COLUMNS``, else the terminal's of
    stdin, stdout or stderr, else 80); None where rich may decide otherwise (a dumb
    terminal, Windows, an encoding other than UTF-8)."""
    term = os.environ.get("TERM", "").lower()
    encoding = (getattr(stream, "encoding", "utf-8") or "utf-8").lower()
    if term in ("dumb", "unknown") or sys.platform == "win32" or not encoding.startswith("utf"):
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def plain_table(rows: list[tuple[str, str]], width: int | None) -> str | None:
    """``rich.table.Table(show_header=False)`` of two columns with ``rows``, as a console of
    ``width`` prints it, for the plain case: printable ASCII without markup, where a value
    too long for its column is one word (rich cuts it with an ellipsis) and the first
    column keeps its width. None otherwise (rich lays it out: wraps, markup, wide
    characters, …). tests/unit/test_cli_startup.py compares it with rich's output."""
    if width is None or width < 20:
        return None
    cells = [cell for row in rows for cell in row]
    if not all(c and c.isascii() and c.isprintable() and "[" not in c for c in cells):
        return None
    first = max(len(label) for label, _ in rows) + 2  # with the cell padding
    second = max(len(value) for _, value in rows) + 2
    room = width - 3  # the three borders
    if first + second > room:
        if 2 * first > room:
            return None
        second = room - first
    inner = second - 2
    out = ["┌" + "─" * first + "┬" + "─" * second + "┐"]
    for label, value in rows:
        if len(value) > inner:
            if " " in value:
                return None  # rich wraps it over lines
            value = value[: inner - 1] + "…"
        out.append(f"│ {label.ljust(first - 2)} │ {value.ljust(inner)} │")
    out.append("└" + "─" * first + "┴" + "─" * second + "┘")
    return "\n".join(out) + "\n"
