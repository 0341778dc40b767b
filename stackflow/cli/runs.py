"""What the run commands share: the exits of a run that cannot go on, the console a run
reports on, the operator's name and the run's Temporal UI link. Standard library only: rich
is imported for a console on a terminal, or for what a plain console cannot write as is."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from stackflow.cli.output import OutputFormat
from stackflow.core.errors import StackflowError

if TYPE_CHECKING:
    from rich.console import Console

    from stackflow.client.types import StackLike

__all__ = [
    "CannotAsk",
    "RunPaused",
    "console_for",
    "current_user",
    "decided_elsewhere",
    "four_eyes_wait",
    "namespace",
    "policy_requires_approval",
    "run_console",
    "ui_link",
]


class RunPaused(StackflowError):
    """The run waits for retry/abort on failed nodes (``--on-failure pause``)."""

    exit_code = 4


class CannotAsk(StackflowError):
    """Approval needed but there is no terminal to ask on: bad input (exit 2)."""

    exit_code = 2


def console_for(output: OutputFormat) -> Console:
    """The rich console a run reports on. In JSON mode everything human goes to stderr so
    stdout stays parseable."""
    from stackflow.cli.console import SafeConsole

    return SafeConsole(stderr=output == OutputFormat.json, soft_wrap=True, emoji=False)


def stdout_is_terminal() -> bool:
    """rich's ``Console.is_terminal`` of stdout (whether a run command draws a progress bar),
    without rich; True where rich may decide otherwise (IPython)."""
    import builtins

    if hasattr(builtins, "get_ipython"):
        return True
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


def run_console(output: OutputFormat) -> Any:
    """The console a run reports on: rich's on a terminal (a progress bar, styles), else a
    :class:`~stackflow.cli.plain_render.PlainConsole` that writes plain text itself and
    makes rich's console only for what rich lays out differently."""
    stream = sys.stderr if output == OutputFormat.json else sys.stdout
    width = console_width(stream)
    if width is None or stdout_is_terminal() or styled_anyway():
        return console_for(output)
    from stackflow.cli.plain_render import PlainConsole

    return PlainConsole(width, lambda: console_for(output), stream)


def styled_anyway() -> bool:
    return bool(os.environ.get("FORCE_COLOR"))


def current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def decided_elsewhere(stack: StackLike, action: str, detail: str) -> str:
    """What a run command says (on stderr) when its own approve or reject comes after the
    run's decision was taken by someone else (another approver, through the API or the
    CLI): it was not sent, and the command follows the run to its end, which says how the
    decision went."""
    return f"{action} not sent for {stack}: {detail}; following the run"


def four_eyes_wait(stack: StackLike, by: str) -> str:
    """What a run command says (on stderr) when its run waits for another approver: the
    worker's four-eyes policy names the project, so neither ``--yes`` nor the requester's
    own approve can approve it. The command then follows the run as it waits."""
    return (
        f"four-eyes: project {stack.project} needs an approver other than {by}, who started "
        f"this run (--yes does not approve it); waiting for another approver's `stackflow "
        f"approve -p {stack.project} -w {stack.workspace}` (or `stackflow reject`)"
    )


def policy_requires_approval(view: dict[str, Any]) -> str | None:
    """Why a run's policies ask for an approver (None: they do not)."""
    raw = view.get("policy")
    if not raw:
        return None
    from stackflow.model.policy import PolicyDecision

    decision = PolicyDecision.model_validate(raw)
    if decision.outcome != "require_approval":
        return None
    return decision.approval_reason()


def namespace() -> str:
    """The Temporal namespace the UI links name (``temporal_client.settings``'s)."""
    return os.environ.get("TEMPORAL_NAMESPACE", "default")


def ui_link(namespace: str, workflow_id: str, run_id: str | None) -> str:
    """The run's page in the Temporal UI (``STACKFLOW_TEMPORAL_UI``)."""
    base = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = quote(workflow_id, safe="")
    return f"{base}/namespaces/{namespace}/workflows/{wid}" + (f"/{run_id}" if run_id else "")
