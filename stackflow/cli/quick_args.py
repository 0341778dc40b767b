"""What the quick answers (:mod:`stackflow.cli.quick`, :mod:`stackflow.cli.quick_run`) share:
their plain options, the API client of the environment, the spec file's text and the checks of
the API's answers. Standard library only, as the quick path must stay."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported at run time: ``typing`` alone costs a third of a fast answer
    from typing import Any

    from stackflow.cli.quick_http import Http

URL_ENV = "STACKFLOW_API_URL"
TOKEN_ENV = "STACKFLOW_API_TOKEN"
MAX_SPEC_BYTES = 512 * 1024 * 1024
"""``stackflow.engine.spec.MAX_SPEC_BYTES``."""
CLOSE_WAIT = 30.0
"""``stackflow.cli.remote.CLOSE_WAIT``: how long a run may say running after its last event."""
COMMON_OPTIONS = {
    "-p": "project",
    "--project": "project",
    "-w": "workspace",
    "--workspace": "workspace",
    "-o": "output",
    "--output": "output",
}
STATUS_OPTIONS = {**COMMON_OPTIONS, "--unavailable-timeout": "timeout"}
PREVIEW_OPTIONS = {**COMMON_OPTIONS, "-f": "file", "--file": "file"}
PREVIEW_FLAGS = {"--detail": ("detail", "yes"), "--no-detail": ("detail", "no")}
RUN_FIELDS = ("run_id", "workflow_id", "operation", "status")
BAD_INPUT_TYPES = (
    "InvalidInput",
    "SpecError",
    "PolicyDenied",
    "NotFound",
    "NotFoundError",
    "Conflict",
)
"""Failure classes that fixing the spec or options resolves: exit 2 (else 1). The typer
commands (``stackflow.cli.report``) and the quick path share this one table."""
HELD_TYPES = ("StackLocked", "OwnedElsewhere")
"""Failure classes of something another run or stack holds (the stack's lock, an object or
path another stack owns): exit 3."""
COMMANDS = ("status", "preview", "apply", "destroy")
"""The commands answered in API mode (in their plain case)."""


def plain(value: str) -> bool:
    """A project, workspace or run id that goes into a URL path as it is."""
    return (
        value.isascii()
        and value.replace("-", "").replace("_", "").replace(".", "").isalnum()
        and value[0].isalnum()
    )


def parse_options(
    args: list[str], options: dict[str, str], flags: dict[str, tuple[str, str]] | None = None
) -> dict[str, str] | None:
    """``options`` given as ``-p X``, ``--project X`` or ``--project=X`` and ``flags``
    (option -> field and value), each field at most once, with values that do not look like
    options, and a plain project and workspace (default ``default``) and an output of table
    or json (the default); None for anything else (the typer command parses it)."""
    flags = flags or {}
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        option, eq, value = args[i].partition("=")
        if not eq and option in flags:
            field, value = flags[option]
            i += 1
        elif eq and option.startswith("--"):
            field = options.get(option, "")
            i += 1
        elif i + 1 < len(args):
            option, value = args[i], args[i + 1]
            field = options.get(option, "")
            i += 2
        else:
            return None
        if not field or field in values or not value or value.startswith("-"):
            return None
        values[field] = value
    values.setdefault("workspace", "default")
    if not plain(values.get("project", "")) or not plain(values["workspace"]):
        return None
    if values.setdefault("output", "table") not in ("table", "json"):
        return None
    return values


def token_and_api() -> Http | None:
    """The API client of ``STACKFLOW_API_URL`` and ``STACKFLOW_API_TOKEN`` for the quick
    path; None without a token (the typer command says so), through a proxy, or for a URL
    it does not take as it is."""
    from stackflow.cli.quick_http import Http, proxied

    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token or proxied():
        return None
    try:
        return Http(os.environ[URL_ENV].strip(), token)
    except ValueError:
        return None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def optional(value: Any, kind: type) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool))


def spec_text(path: str) -> str | None:
    """The spec file's text as the API's ``spec_yaml`` takes it, for a plain file: UTF-8
    without a byte-order mark, under ``stackflow.engine.spec.MAX_SPEC_BYTES``; None for anything
    else (stdin, a file that cannot be read, …: the typer command reads it itself)."""
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size > MAX_SPEC_BYTES:
                return None
            data = file.read(MAX_SPEC_BYTES + 1)
    except (OSError, ValueError):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if len(data) > MAX_SPEC_BYTES or text.startswith("\ufeff") else text
