"""The application: :func:`create_app` builds it from its dependencies (a Temporal
connect function, the state backend, the token table), so tests build one in process;
:func:`app_from_env` builds it from the settings the CLI uses (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``STACKFLOW_TASK_QUEUE``, ``STACKFLOW_STATE_URL``, the encryption
keys, and ``STACKFLOW_API_TOKENS``)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import Client

from stackflow.api import drift, problems, release_admin, sets
from stackflow.api.auth import TokenTable, bearer, load_tokens
from stackflow.api.context import MAX_BODY_BYTES, ApiContext
from stackflow.api.identity import AuthUnavailable
from stackflow.api.metrics import Metrics, sdk_runtime
from stackflow.api.routes import router
from stackflow.api.stream_slots import MAX_STREAMS, StreamSlots
from stackflow.core import heap

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from temporalio.runtime import MetricBuffer, Runtime

    from stackflow.state.backend import StateBackend

log = logging.getLogger("stackflow.api")

PROTECTED = ("/v1/stacks/", "/v1/projects/", "/v1/sets/")
"""Paths that need a bearer token (the guard answers 401 before reading a body)."""


class Guard:
    """The outermost layer: authenticates ``/v1/stacks/…`` (401 before any body is read),
    refuses bodies over the limit (413, by Content-Length or while reading), and turns any
    exception that escaped the handlers into problem+json (never a traceback)."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = 500

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.guarded(scope, receive, counted_send)
        finally:
            route = scope.get("route")
            self.ctx.metrics.request(
                scope.get("method", "GET"),
                getattr(route, "path", None) or "(no route)",
                status,
                time.monotonic() - began,
            )

    async def guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        if path.startswith(PROTECTED):
            raw = headers.get("authorization")
            token = bearer(raw.decode("latin-1") if raw is not None else None)
            try:
                identity = await self.ctx.tokens.authenticate_async(token) if token else None
            except AuthUnavailable as err:
                await problems.problem(503, str(err), "identity-provider-unavailable")(
                    scope, receive, send
                )
                return
            except Exception as exc:
                await problems.unexpected(method, path, exc)(scope, receive, send)
                return
            if identity is None:
                detail = "the bearer token is not valid" if token else "a bearer token is required"
                await problems.problem(
                    401, detail, "unauthorized", headers={"WWW-Authenticate": "Bearer"}
                )(scope, receive, send)
                return
            scope.setdefault("state", {})["identity"] = identity
        limit = self.ctx.max_body_bytes
        length = headers.get("content-length")
        if length is not None:
            try:
                too_big = int(length) > limit
            except ValueError:
                too_big = False
            if too_big:
                await problems.problem(413, too_large(limit), "body-too-large")(
                    scope, receive, send
                )
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, too_large(limit))
            return message

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception as exc:
            if started:
                log.error("error after the response began on %s %s", method, path, exc_info=exc)
                return
            await problems.unexpected(method, path, exc)(scope, receive, send)


def too_large(limit: int) -> str:
    return f"the request body is over {limit} bytes (stackflow serve --max-body-bytes)"


def create_app(
    connect: Callable[[], Awaitable[Client]],
    backend: StateBackend,
    tokens: TokenTable,
    *,
    task_queue: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    sdk_metrics: MetricBuffer | None = None,
    redis_url: str | None = None,
    max_streams: int = MAX_STREAMS,
    ui: bool = True,
) -> FastAPI:
    """The API on Temporal (``connect`` makes its client on first use) and ``backend``;
    ``sdk_metrics``: the buffer of the SDK's metrics of that client (shown at /metrics);
    ``redis_url``: where the run's event bells ring (:mod:`stackflow.state.event_bell`);
    ``max_streams``: the event streams one caller may hold open at once (else 429); ``ui``:
    serve the web UI under ``/ui`` too."""
    from stackflow.state.event_bell import Listener
    from stackflow.temporal.client import settings

    ctx = ApiContext(
        connect=connect,
        backend=backend,
        tokens=tokens,
        task_queue=task_queue or settings()[2],
        max_body_bytes=max_body_bytes,
        metrics=Metrics(sdk_metrics),
        listener=Listener(redis_url),
        streams=StreamSlots(max_streams),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        heap.freeze_started()  # what every request shares stays out of each collection
        yield
        await ctx.listener.close()  # its Redis subscription, if a stream started it

    app = FastAPI(
        lifespan=lifespan,
        title="stackflow",
        summary="Start and steer stackflow runs; read releases.",
        version="1",
        openapi_url="/openapi.json",
    )
    app.state.ctx = ctx
    problems.install(app)
    app.include_router(router)
    app.include_router(drift.router)
    app.include_router(release_admin.router)
    app.include_router(sets.router)
    if ui:
        from stackflow.api import ui as web_ui

        web_ui.install(app)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["health"])
    async def metrics(request: Request) -> PlainTextResponse:
        """The API's request and run-start counters (Prometheus text format)."""
        return PlainTextResponse(
            ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    app.add_middleware(Guard, ctx=ctx)
    return app


async def connect_temporal(runtime: Runtime | None = None) -> Client:
    """A client as the CLI makes one: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, the codec (on
    ``runtime``, else the CLI's quiet one), tracing as STACKFLOW_TRACING says (the API's spans
    are ``stackflow-api``'s)."""
    from stackflow.temporal import tracing
    from stackflow.temporal.client import connect, quiet_runtime
    from stackflow.temporal.codec import data_converter

    return await connect(
        data_converter(),
        runtime=runtime or quiet_runtime(),
        interceptors=tracing.interceptors(tracing.API),
    )


def app_from_env(max_body_bytes: int = MAX_BODY_BYTES, **options: Any) -> FastAPI:
    from stackflow.state.backend import open_backend
    from stackflow.temporal.tls import TemporalTLS

    TemporalTLS.from_env()  # bad TLS / API key settings stop `stackflow serve` at start
    tokens = load_tokens()
    runtime, buffer = sdk_runtime()

    async def connect() -> Client:
        return await connect_temporal(runtime)

    return create_app(
        connect,
        open_backend(),
        tokens,
        max_body_bytes=max_body_bytes,
        sdk_metrics=buffer,
        redis_url=os.environ.get("REDIS_URL") or None,
        **options,
    )
