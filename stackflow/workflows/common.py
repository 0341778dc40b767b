"""Activity options of the operation workflows, built in one place: every call has a
schedule-to-close bound, a start-to-close bound and a retry policy that matches the error
taxonomy of ``activities.errors`` (invalid input, conflicts and fenced writes fail at once;
unavailable infrastructure is retried with backoff until the run's ``unavailable_timeout``;
an unexpected exception is retried at most ``BUG_ATTEMPTS`` times); and the one check of
what a workflow or update is given (``checked_input``)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError
from temporalio.workflow import ActivityCancellationType

NON_RETRYABLE = [
    "InvalidInput",
    "Conflict",
    "NotFound",
    "SpecError",
    "PolicyDenied",
    "Fenced",
    "StackLocked",
    "PhaseConflictError",
    "Unreachable",
    "InternalError",
]
"""Failure types never retried (activities.errors names them)."""

RESOURCE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=20),
    non_retryable_error_types=NON_RETRYABLE,
)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=10),
    non_retryable_error_types=NON_RETRYABLE,
)

RESOURCE_START_TO_CLOSE = timedelta(minutes=30)
RESOURCE_SCHEDULE_TO_CLOSE = timedelta(hours=2)
RESOURCE_HEARTBEAT = timedelta(seconds=15)
"""A worker killed mid-activity is noticed within this and the activity retried elsewhere."""
STORE_START_TO_CLOSE = timedelta(minutes=5)
STORE_SCHEDULE_TO_CLOSE = timedelta(minutes=15)
PREVIEW_BATCH = 200
"""Resources one preview activity reads and diffs."""
PREVIEW_WINDOW = 4
"""Preview activities of a run in flight at once."""
LOCAL_PREVIEW_LIMIT = 100
"""Resources at most of a preview run as a local activity (``Gate.local_preview``): one
batch of runtime calls, within a workflow task (the SDK extends a longer one). Part of what
the local-small-preview patch means: another limit is another patch."""
CLOSE_SCHEDULE_TO_CLOSE = timedelta(minutes=10)
"""Closing a release on the way out: bounded, the next operation's recovery covers the rest."""


def store_call(summary: str, *, closing: bool = False) -> dict[str, Any]:
    """Options of an activity that only reads or writes the state backend."""
    return {
        "start_to_close_timeout": STORE_START_TO_CLOSE,
        "schedule_to_close_timeout": CLOSE_SCHEDULE_TO_CLOSE
        if closing
        else STORE_SCHEDULE_TO_CLOSE,
        "retry_policy": STORE_RETRY,
        "summary": summary,
    }


def resource_call(
    summary: str,
    queue: str | None = None,
    wait_seconds: float | None = None,
    *,
    settle: bool = False,
) -> dict[str, Any]:
    """Options of an activity that calls a runtime (preview batches, apply, delete); on a
    runtime's own task queue (:mod:`stackflow.temporal.runtime_queues`) it waits at most
    ``wait_seconds`` for a worker of that queue to pick it up. ``settle``: a cancel waits for
    the activity to end (it records what it applied first) instead of leaving it running."""
    options: dict[str, Any] = {
        "start_to_close_timeout": RESOURCE_START_TO_CLOSE,
        "schedule_to_close_timeout": RESOURCE_SCHEDULE_TO_CLOSE,
        "heartbeat_timeout": RESOURCE_HEARTBEAT,
        "retry_policy": RESOURCE_RETRY,
        "summary": summary,
    }
    if settle:
        options["cancellation_type"] = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
    if queue:
        options["task_queue"] = queue
        if wait_seconds is not None:
            options["schedule_to_start_timeout"] = timedelta(seconds=wait_seconds)
    return options


R = TypeVar("R")
LOCAL_ATTEMPT = RetryPolicy(maximum_attempts=1)
LOCAL_START_TO_CLOSE = timedelta(seconds=60)
"""The one attempt of a local activity (``local_first``); what may pass goes to the activity."""


async def local_first(
    method: Callable[[Any, Any], Coroutine[Any, Any, R]],
    arg: Any,
    summary: str,
    otherwise: Callable[[], Awaitable[R]],
) -> R:
    """``method`` once as a local activity (in the workflow task, on the run's own worker).
    A failure that may pass (a cluster or host unavailable, a timeout) goes to ``otherwise``:
    the activity as usual, retried within its bounds and seen retrying in the Temporal UI
    (a local activity's retries are not). One that will not pass is raised as an activity's:
    the SDK raises a local activity's own failure bare, where the callers catch
    ``ActivityError`` with it as the cause (a bare one would fail the run, not end it)."""
    try:
        return await workflow.execute_local_activity_method(
            method,
            arg,
            start_to_close_timeout=LOCAL_START_TO_CLOSE,
            retry_policy=LOCAL_ATTEMPT,
            summary=summary,
        )
    except FailureError as exc:
        cause = exc.cause if isinstance(exc, ActivityError) else exc
        final = isinstance(cause, ApplicationError) and (
            cause.non_retryable or cause.type in NON_RETRYABLE
        )
        if not final and not isinstance(cause, CancelledError):
            return await otherwise()
        if isinstance(exc, ActivityError):
            raise
        raise ActivityError(
            str(exc),
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=getattr(method, "__name__", "local activity"),
            activity_id="",
            retry_state=None,
        ) from exc


# ---- inputs ---------------------------------------------------------------------------------
M = TypeVar("M", bound=BaseModel)

INVALID_INPUT = "InvalidInput"
QUOTE_LIMIT = 40
"""Characters of a string value an input error quotes (then its length)."""
LINE_LIMIT = 400
"""An input error is one line of at most this many characters."""
UNQUOTED = frozenset({"spec"})
"""Fields whose values an error never quotes (a spec may hold secrets): only their kind."""


def checked_input(
    model: type[M], args: Sequence[object], *, what: str = "workflow input", empty: M | None = None
) -> M:
    """The one argument a workflow run (or an update) was given, as ``model``; anything else
    raises a non-retryable ``InvalidInput`` ApplicationError, one line naming the field and
    what is wrong (``invalid workflow input: project: Input should be a valid string (got
    5)``).

    Workflow entry points take their arguments undecoded (``*args: object``): had the data
    converter decoded them into the model, a malformed input from any client would fail the
    *workflow task* before workflow code ran, and Temporal retries a workflow task forever,
    the run stuck open under the stack's id. Decoded here, it fails the run at once, before
    any activity (so no release is opened). ``empty``: what no argument at all means (else
    it is an error too)."""
    if not args and empty is not None:
        return empty
    if len(args) != 1:
        raise _invalid(
            what, f"expected one argument, a JSON object ({_fields(model)}), got {len(args)}"
        )
    raw = args[0]
    if isinstance(raw, model):
        return raw
    if not isinstance(raw, dict):
        raise _invalid(what, f"expected a JSON object ({_fields(model)}), got {_kind(raw)}")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise _invalid(what, _describe(model, err)) from None


def _invalid(what: str, problem: str) -> ApplicationError:
    line = f"invalid {what}: {problem}".replace("\n", " ")
    if len(line) > LINE_LIMIT:
        line = line[: LINE_LIMIT - 1] + "…"
    return ApplicationError(line, type=INVALID_INPUT, non_retryable=True)


def _fields(model: type[BaseModel]) -> str:
    names = list(model.model_fields)
    return ", ".join(names[:4]) + (", …" if len(names) > 4 else "")


def _describe(model: type[BaseModel], err: ValidationError) -> str:
    """The first error of a validation as ``field: what is wrong (got value)``."""
    errors = err.errors(include_url=False, include_context=False)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    where = _where(loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        known = list(model.model_fields)
        close = difflib.get_close_matches(str(loc[0]), known, n=1) if loc else []
        message = "unknown field" + (f" (did you mean {close[0]}?)" if close else "")
    else:
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    text = f"{where}: {message}" if where else message
    if loc and kind != "missing":
        quote = loc[0] in model.model_fields and loc[0] not in UNQUOTED
        text += f" (got {_shown(first.get('input'), quote)})"
    if len(errors) > 1:
        text += f"; and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''}"
    return text


def _where(loc: tuple[Any, ...]) -> str:
    """``targets[0]``, ``spec``: where in the input, each part bounded."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = str(part)
        if len(name) > QUOTE_LIMIT:
            name = json.dumps(name[:QUOTE_LIMIT]) + f"… ({len(name)} characters)"
        elif not name.isprintable():
            name = json.dumps(name)
        out += f".{name}" if out else name
    return out


def _shown(value: object, quote: bool) -> str:
    """A value as an error quotes it: scalars as JSON, strings of known fields cut to
    QUOTE_LIMIT, everything else only by kind."""
    if value is None or isinstance(value, bool | float):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else "a very large number"
    if isinstance(value, str) and quote:
        if len(value) <= QUOTE_LIMIT:
            return json.dumps(value)
        return json.dumps(value[:QUOTE_LIMIT]) + f"… ({len(value)} characters)"
    return _kind(value)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({len(value)} characters)"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object with {len(value)} key{'' if len(value) == 1 else 's'}"
    return type(value).__name__
