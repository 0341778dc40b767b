"""A run's event stream over HTTP: NDJSON (``application/x-ndjson``, the default) or Server-Sent
Events (``text/event-stream``), read from the state backend by
:func:`stackflow.state.event_follow.follow`, so any replica serves any stream and a resumed one
(``?after=SEQ`` or SSE's ``Last-Event-ID``) has no gap and no duplicate.

NDJSON: the first line is the stream's header (``{"stream": "stackflow.events", "version": 1,
…}``), then one event per line. SSE: an ``event: stream`` with the header, then one message
per event (``id`` is its ``seq``, ``event`` its type, ``data`` the same JSON as the NDJSON
line), and a comment line every :data:`KEEPALIVE_SECONDS` of quiet. Both end after
``run_complete``.

Each open stream reads the state backend every ``POLL_SECONDS``, so a caller (a token's
identity) holds at most ``max_streams`` of them open on one API process at a time
(:class:`StreamSlots`; ``stackflow serve --max-streams-per-caller`` /
``STACKFLOW_API_MAX_STREAMS``, :data:`MAX_STREAMS` by default): one more is a 429
problem+json, and a slot is free again as soon as a stream ends, or its client goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from stackflow.api.problems import Problem
from stackflow.api.runs import find_run
from stackflow.api.stream_slots import StreamSlot
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.events import StreamHeader
from stackflow.state.event_follow import Closed, Ending, follow_pages, temporal_ending

if TYPE_CHECKING:
    from stackflow.api.context import ApiContext
    from stackflow.api.identity import Identity
    from stackflow.state.protocols import RunEventLog

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
KEEPALIVE_SECONDS = 15.0


class SlotStream(StreamingResponse):
    """A streaming response holding ``slot`` while it streams: freed after the last chunk
    (before the end of the body goes out, so a client that read the end finds it free), or
    when the client goes away or the response fails."""

    def __init__(self, content: AsyncIterator[bytes], slot: StreamSlot, **options: Any) -> None:
        super().__init__(_releasing(content, slot), **options)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


async def _releasing(content: AsyncIterator[bytes], slot: StreamSlot) -> AsyncIterator[bytes]:
    try:
        async for chunk in content:
            yield chunk
    finally:
        slot.release()


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
    log: RunEventLog | None = None,
    closed: Closed | None = None,
) -> AsyncIterator[bytes]:
    """The stream's bytes, header first (``log``, ``closed``: a set run's relay, else the
    run's own log and Temporal's word on its end)."""
    client = await ctx.client()

    async def ended() -> Ending | None:
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
            log or ctx.backend,
            stack,
            run,
            closed or ended,
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


async def event_stream(
    ctx: ApiContext,
    stack: StackRef,
    run_id: str,
    who: Identity,
    after: int,
    kind: str,
    wait: bool = True,
) -> SlotStream:
    """The run's event stream from ``after``, in one of ``who``'s stream slots."""
    described = (await find_run(ctx, stack, run_id))[1]
    return slot_stream(
        ctx,
        who,
        kind,
        stream(ctx, stack, RunRef(described.id, run_id), after=after, kind=kind, wait=wait),
    )


def slot_stream(
    ctx: ApiContext, who: Identity, kind: str, body: AsyncIterator[bytes]
) -> SlotStream:
    """``body`` as the response, in one of ``who``'s stream slots (429 when the caller has
    its most open)."""
    slot = ctx.streams.take(who.name)
    return SlotStream(
        body,
        slot,
        media_type=kind,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
