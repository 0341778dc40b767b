"""What an API answer that is a problem becomes: one typed exception per status, each a
:class:`~stackflow.core.errors.StackflowError` of the class the CLI gives the same exit code
(2 bad input, 3 stack locked, 1 anything else), its message the problem's one-line
``detail``."""

from __future__ import annotations

from typing import Any

from stackflow.core.errors import (
    ConflictError,
    NotFoundError,
    SpecError,
    StackflowError,
    StackLockedError,
)

TYPE_BASE = "urn:stackflow:problem:"
NOT_AWAITING_APPROVAL = "not-awaiting-approval"
"""The kind of a 409 to an approve or reject of a run that no longer awaits one."""


class ApiError(StackflowError):
    """An answer of the API that is not a success: ``status``, the problem's ``type`` (its
    last part: ``stack-locked``, ``invalid-input``, …) and ``detail``, the one line the
    CLI prints (also ``str(err)``)."""

    def __init__(self, detail: str, status: int = 0, kind: str = "", body: Any = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.kind = kind
        self.body = body


class ApiUnauthorized(ApiError):
    """401: no token, or one the server does not know (exit 2: fix the token)."""

    exit_code = 2


class ApiForbidden(ApiError):
    """403: the token's role does not allow the call (exit 2)."""

    exit_code = 2


class ApiInvalid(ApiError, SpecError):
    """400, 413, 422: the request is malformed, too large or invalid (exit 2)."""

    exit_code = 2


class ApiNotFound(ApiError, NotFoundError):
    """404: no such stack, run or release (exit 1)."""

    exit_code = 1


class ApiConflict(ApiError, ConflictError):
    """409: the run is not in a state for this step (exit 1)."""

    exit_code = 1


class ApiStackLocked(ApiError, StackLockedError):
    """409 ``stack-locked``: the stack has an operation running (exit 3)."""

    exit_code = 3


class ApiUnavailable(ApiError):
    """503/502/500, or the API cannot be reached at all (exit 1)."""

    exit_code = 1


class ApiProtocolError(ApiError):
    """The answer is not what this client understands (a stream of another version, a body
    that is not the model): exit 1."""

    exit_code = 1


def error_for(status: int, body: Any, text: str = "") -> ApiError:
    """The exception for an answer with ``status`` and the (problem+json) ``body``."""
    detail = ""
    kind = ""
    if isinstance(body, dict):
        detail = str(body.get("detail") or body.get("title") or "")
        kind = str(body.get("type") or "").removeprefix(TYPE_BASE)
    if not detail:
        detail = " ".join(text.split())[:300] or f"HTTP {status}"
    detail = " ".join(detail.split())
    cls: type[ApiError]
    if status == 401:
        cls = ApiUnauthorized
    elif status == 403:
        cls = ApiForbidden
    elif status == 404:
        cls = ApiNotFound
    elif status == 409:
        cls = ApiStackLocked if kind == "stack-locked" else ApiConflict
    elif status in (400, 405, 413, 415, 422):
        cls = ApiInvalid
    else:
        cls = ApiUnavailable
    return cls(detail, status, kind, body)


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
    "error_for",
]
