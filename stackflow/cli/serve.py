"""`stackflow serve`: the HTTP API (:mod:`stackflow.api`) on uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from stackflow.cli.app import app
from stackflow.core.errors import StackflowError


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8080,
    max_body_bytes: Annotated[
        int,
        typer.Option("--max-body-bytes", min=1024, help="Largest request body (else 413)."),
    ] = 8 * 1024 * 1024,
    max_streams: Annotated[
        int,
        typer.Option(
            "--max-streams-per-caller",
            min=1,
            envvar="STACKFLOW_API_MAX_STREAMS",
            help="Event streams one caller (token) may hold open at once (else 429).",
        ),
    ] = 8,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level.")] = "info",
) -> None:
    """Serve the HTTP API and the approvers' web UI (/ui): runs, releases, outputs (bearer
    tokens from the file STACKFLOW_API_TOKENS names; Temporal and the state backend as the CLI
    reaches them)."""
    from stackflow.core import heap

    heap.limit_malloc_arenas()  # before any thread starts
    try:
        import uvicorn

        from stackflow.api.app import app_from_env
    except ModuleNotFoundError as err:  # a venv from before the API's dependencies
        raise StackflowError(
            f"stackflow serve needs {err.name}, which this environment lacks: install the "
            "project's dependencies again (`make setup`, or `uv sync --frozen`)"
        ) from None

    from stackflow.temporal.client import settings
    from stackflow.temporal.tls import TemporalTLS

    api = app_from_env(max_body_bytes=max_body_bytes, max_streams=max_streams)
    typer.echo(
        f"stackflow api serving on http://{host}:{port} (OpenAPI at /openapi.json, web UI at "
        f"/ui/; Temporal at {settings()[0]} over {TemporalTLS.from_env().describe()})"
    )
    uvicorn.run(api, host=host, port=port, log_level=log_level, server_header=False)
