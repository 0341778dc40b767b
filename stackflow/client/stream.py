"""A run's event stream as typed objects: the NDJSON lines of ``GET …/runs/{run_id}/events``
(header first, then ``{seq, type, time, ...}``) parsed into the light
:class:`~stackflow.client.types.StreamHeader` and :class:`~stackflow.client.types.RunEvent`."""

from __future__ import annotations

import json
from typing import Any

from stackflow.client.errors import ApiProtocolError
from stackflow.client.types import (
    STREAM_NAME,
    STREAM_VERSION,
    Invalid,
    RunEvent,
    StreamHeader,
    parse,
)

EVENT_FIELDS = ("seq", "type", "time")


def parse_header(line: str) -> StreamHeader:
    """The stream's first line; ApiProtocolError when it is not a version-1 stackflow stream."""
    data = _json(line)
    if data.get("stream") != STREAM_NAME:
        raise ApiProtocolError(f"not a stackflow event stream (first line {line[:80]!r})")
    if data.get("version") != STREAM_VERSION:
        raise ApiProtocolError(
            f"event stream version {data.get('version')!r}: this client reads version "
            f"{STREAM_VERSION} (upgrade stackflow)"
        )
    try:
        return parse(StreamHeader, data)
    except Invalid as exc:
        raise ApiProtocolError(f"bad event stream header: {exc}") from None


def parse_event(line: str) -> RunEvent:
    """One event line: ``seq``, ``type`` and ``time`` as fields, the rest its ``data``."""
    data = _json(line)
    rest = {k: v for k, v in data.items() if k not in EVENT_FIELDS}
    fields = {k: data[k] for k in EVENT_FIELDS if k in data}
    try:
        return parse(RunEvent, {**fields, "data": rest})
    except Invalid as exc:
        raise ApiProtocolError(f"bad event line: {exc}") from None


def _json(line: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError:
        raise ApiProtocolError(f"event stream line is not JSON: {line[:80]!r}") from None
    if not isinstance(data, dict):
        raise ApiProtocolError(f"event stream line is not an object: {line[:80]!r}")
    return data
