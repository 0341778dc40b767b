"""The cap on a caller's concurrent event streams (:class:`stackflow.api.stream_slots.StreamSlots`):
one over the cap is a 429 problem, and a stream's slot is free again however the stream ends:
read to its end, its client gone (an ASGI ``http.disconnect`` mid-stream), or failed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stackflow.api.events import SlotStream
from stackflow.api.problems import Problem
from stackflow.api.stream_slots import StreamSlots


def test_a_caller_over_its_cap_is_429_and_others_are_not_held_back() -> None:
    slots = StreamSlots(2)
    first, _ = slots.take("alice"), slots.take("alice")
    with pytest.raises(Problem) as err:
        slots.take("alice")
    assert err.value.status == 429 and err.value.kind == "too-many-streams"
    assert err.value.headers == {"Retry-After": "5"}
    assert err.value.detail.startswith("alice already has 2 event streams open")
    slots.take("bob")
    first.release()
    first.release()  # once only
    assert slots.open == {"alice": 1, "bob": 1}
    slots.take("alice")


async def endless() -> AsyncIterator[bytes]:
    while True:
        yield b'{"seq": 1}\n'
        await asyncio.sleep(0)


async def call(response: SlotStream, *, disconnect_after: int | None) -> list[dict[str, Any]]:
    """Serve ``response`` as uvicorn does (ASGI 2.3: a disconnect comes through receive),
    the client going away after that many body messages (None: read to the end)."""
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        bodies = sum(1 for m in sent if m["type"] == "http.response.body")
        if disconnect_after is not None and bodies >= disconnect_after:
            gone.set()
        await asyncio.sleep(0)

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "GET", "headers": []}
    await asyncio.wait_for(response(scope, receive, send), timeout=10)
    return sent


async def test_a_client_that_goes_away_frees_its_slot() -> None:
    slots = StreamSlots(1)
    await call(SlotStream(endless(), slots.take("alice")), disconnect_after=3)
    assert slots.open == {}


async def test_a_stream_read_to_its_end_frees_its_slot_before_the_body_ends() -> None:
    slots = StreamSlots(1)
    seen: list[dict[str, int]] = []

    async def two() -> AsyncIterator[bytes]:
        yield b"a\n"
        yield b"b\n"

    class Watching(SlotStream):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def watched(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    seen.append(dict(slots.open))  # what a client reading the end would find
                await send(message)

            await super().__call__(scope, receive, watched)

    sent = await call(Watching(two(), slots.take("alice")), disconnect_after=None)
    assert [m.get("body") for m in sent[1:]] == [b"a\n", b"b\n", b""]
    assert seen == [{}] and slots.open == {}


async def test_a_stream_that_fails_frees_its_slot() -> None:
    slots = StreamSlots(1)

    async def broken() -> AsyncIterator[bytes]:
        yield b"a\n"
        raise RuntimeError("the backend went away")

    with pytest.raises(RuntimeError):
        await call(SlotStream(broken(), slots.take("alice")), disconnect_after=None)
    assert slots.open == {}
