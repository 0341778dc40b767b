"""Activity call options shared by the operation workflows: explicit timeouts and retries."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

# Runtime errors marked non-retryable (invalid input, conflicts) fail at once; unavailable
# infrastructure is retried with backoff until the schedule-to-close budget runs out.
RESOURCE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=20),
    non_retryable_error_types=["InvalidInput", "Conflict", "NotFound", "SpecError", "Fenced"],
)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=10),
    non_retryable_error_types=[
        "StackLocked",
        "SpecError",
        "InvalidInput",
        "NotFound",
        "Fenced",
        "PhaseConflictError",
    ],
)

RESOURCE_START_TO_CLOSE = timedelta(minutes=30)
RESOURCE_SCHEDULE_TO_CLOSE = timedelta(hours=2)
RESOURCE_HEARTBEAT = timedelta(seconds=15)
"""A worker killed mid-activity is noticed within this and the activity retried elsewhere."""
STORE_START_TO_CLOSE = timedelta(minutes=5)
PREVIEW_BATCH = 200
"""Resources one preview activity reads and diffs."""
CLOSE_SCHEDULE_TO_CLOSE = timedelta(minutes=10)
"""Closing a release on the way out: bounded, the next operation's recovery covers the rest."""
