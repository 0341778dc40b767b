"""A typed Python client of stackflow's HTTP API (``stackflow serve``), the one the CLI uses
when ``STACKFLOW_API_URL`` is set::

    from stackflow.client import RunRequest, StackflowClient
    from stackflow.core.refs import StackRef

    with StackflowClient.from_env() as api:
        stack = StackRef("demo", "dev")
        run = api.start_run(stack, RunRequest(operation="apply", spec=spec, auto_approve=True))
        for event in api.events(stack, run.run_id):
            print(event.line())

Light to import: httpx and pydantic, never temporalio or fastapi.
"""

from __future__ import annotations

from stackflow.api.models import (
    NotificationTargetView,
    RunCreated,
    RunOperation,
    RunPage,
    RunRequest,
    RunSummary,
    RunView,
    SourceView,
    StepResult,
)
from stackflow.client.errors import (
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiInvalid,
    ApiNotFound,
    ApiProtocolError,
    ApiStackLocked,
    ApiUnauthorized,
    ApiUnavailable,
)
from stackflow.client.http import EventStream, StackflowClient
from stackflow.model.events import EventType, RunEvent, StreamHeader
from stackflow.model.notifications import Destination
from stackflow.model.source import GitSource, SourceMode

__all__ = [
    "ApiConflict",
    "ApiError",
    "ApiForbidden",
    "ApiInvalid",
    "ApiNotFound",
    "ApiProtocolError",
    "ApiStackLocked",
    "ApiUnauthorized",
    "ApiUnavailable",
    "Destination",
    "EventStream",
    "EventType",
    "GitSource",
    "NotificationTargetView",
    "RunCreated",
    "RunEvent",
    "RunOperation",
    "RunPage",
    "RunRequest",
    "RunSummary",
    "RunView",
    "SourceMode",
    "SourceView",
    "StackflowClient",
    "StepResult",
    "StreamHeader",
]
