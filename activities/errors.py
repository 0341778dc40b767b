"""Maps engine and runtime errors onto Temporal's retry semantics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from temporalio.exceptions import ApplicationError

from runtimes.base import RuntimeFailure
from stackflow.errors import (
    BackendUnavailableError,
    FencedError,
    SpecError,
    StackflowError,
    StackLockedError,
)


def to_application_error(exc: BaseException) -> BaseException:
    """Non-retryable for bad input and conflicts; retryable for unavailable infrastructure.

    Anything unknown is returned as it is, so Temporal retries it (an idempotent activity
    may always run again).
    """
    if isinstance(exc, RuntimeFailure):
        return ApplicationError(str(exc), type=exc.kind, non_retryable=not exc.retryable)
    if isinstance(exc, BackendUnavailableError):
        return ApplicationError(str(exc), type="BackendUnavailable", non_retryable=False)
    if isinstance(exc, FencedError):
        return ApplicationError(str(exc), type="Fenced", non_retryable=True)
    if isinstance(exc, StackLockedError):
        return ApplicationError(str(exc), type="StackLocked", non_retryable=True)
    if isinstance(exc, SpecError):
        return ApplicationError(str(exc), type="SpecError", non_retryable=True)
    if isinstance(exc, StackflowError):
        return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)
    return exc


@contextlib.contextmanager
def temporal_errors() -> Iterator[None]:
    """Wraps an activity body: engine and runtime errors leave it as ApplicationErrors."""
    try:
        yield
    except Exception as exc:
        mapped = to_application_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
