"""A run's event stream as typed objects: the NDJSON lines of ``GET …/runs/{run_id}/events``
(header first, then ``{seq, type, time, ...}``) parsed into :class:`StreamHeader` and
:class:`RunEvent`, the same classes the state backend and the API serve them from."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from stackflow.client.errors import ApiProtocolError
from stackflow.model.events import STREAM_NAME, STREAM_VERSION, RunEvent, StreamHeader

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
        return StreamHeader.model_validate(data)
    except ValidationError as exc:
        raise ApiProtocolError(f"bad event stream header: {_first(exc)}") from None


def parse_event(line: str) -> RunEvent:
    """One event line: ``seq``, ``type`` and ``time`` as fields, the rest its ``data``."""
    data = _json(line)
    rest = {k: v for k, v in data.items() if k not in EVENT_FIELDS}
    try:
        return RunEvent.model_validate({**{k: data.get(k) for k in EVENT_FIELDS}, "data": rest})
    except ValidationError as exc:
        raise ApiProtocolError(f"bad event line: {_first(exc)}") from None


def _json(line: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError:
        raise ApiProtocolError(f"event stream line is not JSON: {line[:80]!r}") from None
    if not isinstance(data, dict):
        raise ApiProtocolError(f"event stream line is not an object: {line[:80]!r}")
    return data


def _first(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'line'}: {first['msg']}"
