"""A typed Python client of stackflow's HTTP API (``stackflow serve``), the one the CLI uses
when ``STACKFLOW_API_URL`` is set::

    from stackflow.client import StackflowClient
    from stackflow.core.refs import StackRef

    with StackflowClient.from_env() as api:
        stack = StackRef("demo", "dev")
        run = api.start_run(stack, {"operation": "apply", "spec": spec, "auto_approve": True})
        for event in api.events(stack, run.run_id):
            print(event.line())

Light to import: the standard library only (``http.client``); the answers are the records
of :mod:`stackflow.client.types`, the types the server answers with. A request may be the
server's pydantic ``RunRequest`` (``stackflow.api.models``) or its JSON.
"""

from __future__ import annotations

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
from stackflow.client.types import (
    NotificationTargetView,
    PolicyView,
    RunCreated,
    RunEvent,
    RunOperation,
    RunPage,
    RunSummary,
    RunView,
    SourceView,
    StepResult,
    StreamHeader,
)

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
    "EventStream",
    "NotificationTargetView",
    "PolicyView",
    "RunCreated",
    "RunEvent",
    "RunOperation",
    "RunPage",
    "RunSummary",
    "RunView",
    "SourceView",
    "StackflowClient",
    "StepResult",
    "StreamHeader",
]
