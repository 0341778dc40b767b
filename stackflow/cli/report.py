"""How a run command reports the run's end, in either mode (Temporal directly, or the API):
its result as JSON or a few lines, and the exit code of its failure's class."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from stackflow.cli.output import OutputFormat
from stackflow.cli.plain_render import render_outcome
from stackflow.cli.quick_args import BAD_INPUT_TYPES as BAD_INPUT_TYPES
from stackflow.cli.quick_args import HELD_TYPES as HELD_TYPES
from stackflow.core.errors import OperationFailed, SpecError, StackflowError, StackLockedError
from stackflow.engine.masking import masked_release_data
from stackflow.model.release import Phase
from stackflow.temporal.operation import OperationResult

ReleaseOf = Callable[[OperationResult], dict[str, Any] | None]


def report(
    output: OutputFormat,
    console: Console,
    result: OperationResult,
    link: str,
    release_of: ReleaseOf,
) -> None:
    """Print the run's result; raise its failure (one line on stderr, its exit code)."""
    if output == OutputFormat.json:
        data = result.model_dump(mode="json")
        data["release"] = release_of(result)
        data["ui"] = link
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        render_outcome(
            console,
            str(result.operation),
            str(result.stack),
            result.revision,
            str(result.phase),
            [(r.id, str(r.status), r.error) for r in result.results],
            link,
        )
    raise_failure(result)


def raise_failure(result: OperationResult) -> None:
    """A run that ended failed: one line on stderr, and the exit code of the failure's class."""
    if result.phase == Phase.failed:
        message = result.error or f"{result.operation} failed"
        if result.error_type in HELD_TYPES:
            raise StackLockedError(message)
        if result.error_type in BAD_INPUT_TYPES:
            raise SpecError(message)
        raise OperationFailed(message)


def workflow_failure(workflow: str, message: str, error_type: str | None) -> StackflowError:
    """What a run that failed as a workflow (not with a failed result) raises: the stack
    busy or the object held by another stack (exit 3), bad input (exit 2), anything else
    (exit 1)."""
    if error_type in HELD_TYPES:
        return StackLockedError(message)
    if error_type in BAD_INPUT_TYPES:
        return SpecError(message)
    return OperationFailed(f"{workflow} failed: {message}")


def release_from_backend(result: OperationResult) -> dict[str, Any] | None:
    """The release as stored, when this machine reaches the state backend
    (``STACKFLOW_STATE_URL``); None otherwise (the run's result has the rest)."""
    if result.revision is None:
        return None
    from stackflow.state.backend import open_backend

    try:
        backend = open_backend()
        try:
            release = backend.get(result.stack, result.revision)
        finally:
            backend.close()
    except StackflowError:
        return None
    return masked_release_data(release)
