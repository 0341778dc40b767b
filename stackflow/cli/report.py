"""How a run command reports the run's end: its result (``OperationResult``'s JSON, from the
API's answers: :func:`result_data`) as JSON or a few lines, and the exit code of its
failure's class (the one mapping of failures to exit codes)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from stackflow.cli.output import OutputFormat, echo
from stackflow.cli.plain_render import render_outcome
from stackflow.core.errors import OperationFailed, SpecError, StackflowError, StackLockedError

BAD_INPUT_TYPES = (
    "InvalidInput",
    "SpecError",
    "PolicyDenied",
    "NotFound",
    "NotFoundError",
    "Conflict",
)
"""Failure classes that fixing the spec or options resolves: exit 2 (else 1)."""
HELD_TYPES = ("StackLocked", "OwnedElsewhere")
"""Failure classes of something another run or stack holds (the stack's lock, an object or
path another stack owns): exit 3."""

ReleaseOf = Callable[[int | None], dict[str, Any] | None]


def report(
    output: OutputFormat,
    console: Any,
    data: dict[str, Any],
    link: str,
    release_of: ReleaseOf,
) -> None:
    """Print the run's result (``OperationResult``'s JSON); raise its failure (one line on
    stderr, its exit code)."""
    if output == OutputFormat.json:
        data = {**data, "release": release_of(data.get("revision")), "ui": link}
        echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        render_outcome(
            console,
            str(data["operation"]),
            f"{data['project']}/{data['workspace']}",
            data.get("revision"),
            str(data["phase"]),
            [(r["id"], str(r["status"]), r.get("error")) for r in data["results"]],
            link,
        )
    raise_failure(data)


def raise_failure(data: Mapping[str, Any]) -> None:
    """A run that ended failed (a result, or a run's view, whose phase is failed): one line
    on stderr, and the exit code of the failure's class."""
    if data.get("phase") == "failed":
        message = data.get("error") or f"{data['operation']} failed"
        raise failure(message, data.get("error_type"))


def failure(message: str, error_type: str | None) -> StackflowError:
    """The stack busy or the object held by another stack (exit 3), bad input (exit 2),
    anything else (exit 1)."""
    if error_type in HELD_TYPES:
        return StackLockedError(message)
    if error_type in BAD_INPUT_TYPES:
        return SpecError(message)
    return OperationFailed(message)


def workflow_failure(workflow: str, message: str, error_type: str | None) -> StackflowError:
    """What a run that failed as a workflow (not with a failed result) raises."""
    err = failure(message, error_type)
    if isinstance(err, OperationFailed):
        return OperationFailed(f"{workflow} failed: {message}")
    return err


def result_data(
    stack: Any,
    view: Any,
    changes: dict[str, Any],
    results: list[dict[str, Any]],
    counts: dict[str, int] | None,
) -> dict[str, Any]:
    """``OperationResult``'s JSON of a run through the API: its final ``view`` (with the run's
    result once it completed) and its preview ``changes``; a run that ended without a result
    has the node ``results`` its events gave (``NodeResult``'s JSON) and their ``counts`` (by
    status when ``run_complete`` had none). A unit test keeps the keys ``OperationResult``'s."""
    if view.result is not None:
        return {**view.result, "changes": changes}
    if counts is None:
        counts = {}
        for node in results:
            counts[node["status"]] = counts.get(node["status"], 0) + 1
    return {
        "project": stack.project,
        "workspace": stack.workspace,
        "operation": view.operation,
        "revision": view.revision,
        "phase": view.phase or "failed",
        "changes": changes,
        "results": results,
        "error": view.error,
        "error_type": view.error_type,
        "counts": counts,
        "policy": None,
        "truncated": False,
    }
