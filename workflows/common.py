"""Activity options of the operation workflows, built in one place: every call has a
schedule-to-close bound, a start-to-close bound and a retry policy that matches the error
taxonomy of ``activities.errors`` (invalid input, conflicts and fenced writes fail at once;
unavailable infrastructure is retried with backoff until the run's ``unavailable_timeout``;
an unexpected exception is retried at most ``BUG_ATTEMPTS`` times)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

NON_RETRYABLE = [
    "InvalidInput",
    "Conflict",
    "NotFound",
    "SpecError",
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


def resource_call(summary: str) -> dict[str, Any]:
    """Options of an activity that calls a runtime (preview batches, apply, delete)."""
    return {
        "start_to_close_timeout": RESOURCE_START_TO_CLOSE,
        "schedule_to_close_timeout": RESOURCE_SCHEDULE_TO_CLOSE,
        "heartbeat_timeout": RESOURCE_HEARTBEAT,
        "retry_policy": RESOURCE_RETRY,
        "summary": summary,
    }
