"""What the run commands share in either mode (Temporal directly, or the HTTP API) and that
needs no Temporal: the exits of a run that cannot go on, the console a run reports on, the
operator's name and the run's Temporal UI link."""

from __future__ import annotations

from rich.console import Console

from stackflow.cli.output import OutputFormat, SafeConsole
from stackflow.cli.quick import ui_link
from stackflow.core.errors import StackflowError

TYPE_CHECKING = False
if TYPE_CHECKING:  # the quick path imports this module: no pydantic (stackflow.cli.quick)
    from stackflow.core.refs import StackRef

__all__ = [
    "CannotAsk",
    "RunPaused",
    "console_for",
    "current_user",
    "four_eyes_wait",
    "ui_link",
]


class RunPaused(StackflowError):
    """The run waits for retry/abort on failed nodes (``--on-failure pause``)."""

    exit_code = 4


class CannotAsk(StackflowError):
    """Approval needed but there is no terminal to ask on: bad input (exit 2)."""

    exit_code = 2


def console_for(output: OutputFormat) -> Console:
    # In JSON mode everything human goes to stderr so stdout stays parseable.
    return SafeConsole(stderr=output == OutputFormat.json, soft_wrap=True, emoji=False)


def current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def four_eyes_wait(stack: StackRef, by: str) -> str:
    """What a run command says (on stderr) when its run waits for another approver: the
    worker's four-eyes policy names the project, so neither ``--yes`` nor the requester's
    own approve can approve it. The command then follows the run as it waits."""
    return (
        f"four-eyes: project {stack.project} needs an approver other than {by}, who started "
        f"this run (--yes does not approve it); waiting for another approver's `stackflow "
        f"approve -p {stack.project} -w {stack.workspace}` (or `stackflow reject`)"
    )
