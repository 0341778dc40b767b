"""A run's event stream over HTTP: NDJSON (``application/x-ndjson``, the default) or Server-Sent
Events (``text/event-stream``), read from the state backend by
:func:`stackflow.event_follow.follow`, so any replica serves any stream and a resumed one
(``?after=SEQ`` or SSE's ``Last-Event-ID``) has no gap and no duplicate.

NDJSON: the first line is the stream's header (``{"stream": "stackflow.events", "version": 1,
…}``), then one event per line. SSE: an ``event: stream`` with the header, then one message
per event (``id`` is its ``seq``, ``event`` its type, ``data`` the same JSON as the NDJSON
line), and a comment line every :data:`KEEPALIVE_SECONDS` of quiet. Both end after
``run_complete``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from stackflow.api.context import ApiContext
from stackflow.api.problems import Problem
from stackflow.event_follow import Ending, follow_pages, temporal_ending
from stackflow.events import StreamHeader
from stackflow.refs import RunRef, StackRef

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
KEEPALIVE_SECONDS = 15.0


def media_type(accept: str | None) -> str:
    """SSE when the client asks for it, else NDJSON."""
    return SSE if accept and SSE in accept.lower() else NDJSON


def cursor(after: int | None, last_event_id: str | None) -> int:
    """Where a stream starts: SSE's ``Last-Event-ID`` (a reconnect) over ``?after``."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit() or len(text) > 12:
            raise Problem(
                400,
                f"Last-Event-ID {text[:40]!r} is not an event seq: send the id of the last "
                "event received (a whole number)",
                "bad-request",
            )
        return int(text)
    return after or 0


async def stream(
    ctx: ApiContext,
    stack: StackRef,
    run: RunRef,
    *,
    after: int,
    kind: str,
    wait: bool = True,
) -> AsyncIterator[bytes]:
    """The stream's bytes, header first."""
    client = await ctx.client()

    async def closed() -> Ending | None:
        return await temporal_ending(client, run)

    header = StreamHeader(
        project=stack.project,
        workspace=stack.workspace,
        workflow_id=run.workflow_id,
        run_id=run.run_id,
    ).line()
    sse = kind == SSE
    yield (f"event: stream\ndata: {header}\n\n" if sse else header + "\n").encode()
    with ctx.listener.nudge(run.run_id) as nudge:
        pages = follow_pages(
            ctx.backend,
            stack,
            run,
            closed,
            after=after,
            wait=wait,
            idle_seconds=KEEPALIVE_SECONDS if sse else None,
            nudge=nudge,
        )
        # a page of events (what one read found) goes out as one chunk: one write, not one
        # per event (a 1,000-node run has some 3,000 events)
        async for page in pages:
            if page is None:
                yield b": keep-alive\n\n"
            elif sse:
                yield "".join(
                    f"id: {e.seq}\nevent: {e.type.value}\ndata: {e.line()}\n\n" for e in page
                ).encode()
            else:
                yield "".join(e.line() + "\n" for e in page).encode()
