"""The error taxonomy, in one place: every activity failure leaves as one of

- **invalid input** (``InvalidInput``, ``SpecError``, ``PolicyDenied``, ``NotFound``): never
  retried; one line naming the resource and the field;
- **conflict** (``Conflict``, ``Fenced``, ``StackLocked``, ``PhaseConflictError``): never retried;
- **unavailable** (``Unavailable``, ``BackendUnavailable``): retried with backoff until the run's
  ``unavailable_timeout`` has passed since the activity was first scheduled, then
  ``Unreachable`` (not retried) saying what was unreachable and for how long;
- **bug** (any other exception): retried at most ``BUG_ATTEMPTS`` times in all, then
  ``InternalError`` (not retried) with the traceback kept in the failure's details.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from stackflow.core.errors import (
    BackendUnavailableError,
    FencedError,
    PolicyDenied,
    SpecError,
    StackflowError,
    StackLockedError,
)
from stackflow.runtimes.base import RuntimeFailure

BUG_ATTEMPTS = 3
DEFAULT_UNAVAILABLE_TIMEOUT = 600.0


def _elapsed() -> float:
    """Seconds since this activity's first attempt was scheduled (0 outside an activity)."""
    if not activity.in_activity():
        return 0.0
    first = activity.info().scheduled_time
    return max(0.0, (datetime.now(UTC) - first).total_seconds())


def _attempt() -> int:
    return activity.info().attempt if activity.in_activity() else 1


def _unavailable(message: str, kind: str, unavailable_timeout: float) -> ApplicationError:
    elapsed = _elapsed()
    if elapsed >= unavailable_timeout:
        return ApplicationError(
            f"{message} (unreachable for {elapsed:.0f}s, past the run's "
            f"unavailable_timeout of {unavailable_timeout:g}s)",
            type="Unreachable",
            non_retryable=True,
        )
    return ApplicationError(message, type=kind, non_retryable=False)


def to_application_error(
    exc: BaseException, unavailable_timeout: float = DEFAULT_UNAVAILABLE_TIMEOUT
) -> BaseException:
    """The ApplicationError ``exc`` stands for (see the module's taxonomy)."""
    if isinstance(exc, ApplicationError):
        return exc
    if isinstance(exc, RuntimeFailure):
        if exc.retryable:
            return _unavailable(str(exc), exc.kind, unavailable_timeout)
        return ApplicationError(str(exc), type=exc.kind, non_retryable=True)
    if isinstance(exc, BackendUnavailableError):
        return _unavailable(str(exc), "BackendUnavailable", unavailable_timeout)
    if isinstance(exc, FencedError):
        return ApplicationError(str(exc), type="Fenced", non_retryable=True)
    if isinstance(exc, StackLockedError):
        return ApplicationError(str(exc), type="StackLocked", non_retryable=True)
    if isinstance(exc, PolicyDenied):
        return ApplicationError(str(exc), type="PolicyDenied", non_retryable=True)
    if isinstance(exc, SpecError):
        return ApplicationError(str(exc), type="SpecError", non_retryable=True)
    if isinstance(exc, StackflowError):
        return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)
    # A bug: a few attempts (a transient fault may hide as one), then stop and say so.
    trace = "".join(traceback.format_exception(exc))[-8000:]
    last = _attempt() >= BUG_ATTEMPTS
    return ApplicationError(
        f"internal error: {type(exc).__name__}: {exc}"
        + (f" (after {BUG_ATTEMPTS} attempts)" if last else ""),
        trace,
        type="InternalError" if last else "Bug",
        non_retryable=last,
    )


@contextlib.contextmanager
def temporal_errors(unavailable_timeout: float = DEFAULT_UNAVAILABLE_TIMEOUT) -> Iterator[None]:
    """Wraps an activity body: whatever it raises leaves classified (see the module).

    The original exception is not chained: Temporal would record it as the failure's cause,
    in clear in history, and its text may quote a value (pydantic quotes the input it
    refused, an API server the field it rejected). A bug's traceback travels in the
    failure's details, which the payload codec encrypts."""
    try:
        yield
    except Exception as exc:
        raise to_application_error(exc, unavailable_timeout) from None
