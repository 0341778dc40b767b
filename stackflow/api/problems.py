"""Errors as RFC 9457 ``application/problem+json``: ``{type, title, status, detail}``, the
detail being the same one line the CLI prints. Every exception a request can raise ends
here: stackflow's own errors by class (:func:`status_of`), FastAPI's validation errors as
``field: message``, Starlette's HTTP errors (404, 405, 413) as they are, and anything else
as a 500 that names an error id from the server's log, never a traceback."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from stackflow.core.errors import (
    BackendUnavailableError,
    ConflictError,
    NotFoundError,
    OperationFailed,
    SchemaError,
    SpecError,
    StackflowError,
    StackLockedError,
)
from stackflow.temporal.client import TemporalRefused, TemporalUnreachable, connection_error

log = logging.getLogger("stackflow.api")

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "urn:stackflow:problem:"

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class Problem(Exception):
    """An answer that is a problem: raised by handlers, rendered by :func:`problem`."""

    def __init__(
        self,
        status: int,
        detail: str,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind or _slug(TITLES.get(status, "error"))
        self.headers = headers
        self.extra = extra


def _slug(title: str) -> str:
    return title.lower().replace(" ", "-")


def problem(
    status: int,
    detail: str,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {
        "type": TYPE_BASE + (kind or _slug(TITLES.get(status, "error"))),
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def status_of(err: StackflowError) -> tuple[int, str]:
    """The HTTP status and problem type of one of stackflow's errors (the CLI's exit code
    says the same: 2 bad input, 3 locked, 1 failed)."""
    if isinstance(err, StackLockedError):
        return 409, "stack-locked"
    if isinstance(err, SchemaError | BackendUnavailableError):
        return 503, "state-backend-unavailable"
    if isinstance(err, NotFoundError):
        return 404, "not-found"
    if isinstance(err, ConflictError):
        return 409, "conflict"
    if isinstance(err, SpecError):
        return 422, "invalid-input"
    if isinstance(err, TemporalUnreachable):
        return 503, "temporal-unavailable"
    if isinstance(err, TemporalRefused):
        return 502, "temporal-refused"
    if isinstance(err, OperationFailed):
        return 409, "refused"
    if err.exit_code == 2:  # bad input of another kind (a key that is missing or wrong)
        return 422, "invalid-input"
    return 500, "operation-failed"


def validation_detail(exc: RequestValidationError) -> tuple[int, str]:
    """``field: message`` of the first error (and how many more), 400 for a body that is
    not JSON at all, 422 for JSON of the wrong shape."""
    errors = list(exc.errors())
    if not errors:
        return 422, "invalid request"
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    where = ".".join(loc) or "body"
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return 400, f"the body is not valid JSON: {ctx.get('error', first.get('msg'))}"
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
    if first.get("type") == "missing" and loc and loc[0] == "header":
        msg = "header missing"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return 422, " ".join(f"{where}: {msg}{more}".split())


def install(app: FastAPI) -> None:
    """Register the handlers that turn every exception into problem+json."""

    @app.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> JSONResponse:
        return problem(exc.status, exc.detail, exc.kind, exc.headers, **exc.extra)

    @app.exception_handler(StackflowError)
    async def on_stackflow(request: Request, exc: StackflowError) -> JSONResponse:
        status, kind = status_of(exc)
        return problem(status, str(exc), kind)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = validation_detail(exc)
        return problem(status, detail, "invalid-json" if status == 400 else "invalid-input")

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return problem(exc.status_code, detail, headers=dict(exc.headers or {}))


def unexpected(method: str, path: str, exc: BaseException) -> JSONResponse:
    """What an exception no handler knows becomes: a Temporal connection or RPC error is the
    CLI's one line (503/502); anything else a 500 naming an id the server's log has the
    traceback under."""
    err = connection_error(exc)
    if err is not None:
        status, kind = status_of(err)
        return problem(status, str(err), kind)
    error_id = uuid.uuid4().hex[:12]
    log.error("error %s on %s %s", error_id, method, path, exc_info=exc)
    return problem(
        500, f"internal error {error_id}: the server's log has the details", "internal-error"
    )
