"""A run's event stream as lines on stdout (``--output ndjson`` of the run commands and
`stackflow events`): what both modes and both ways in share, standard library only."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

Item = Any
"""A stream's header or event: the model's (directly) or the client's light type (API)."""
Sink = Callable[[Item], None]


def is_header(item: Item) -> bool:
    return hasattr(item, "stream")


def write_line(text: str) -> None:
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None


def ndjson_sink(item: Item) -> None:
    """The stream's own lines (JSON is exact: nothing escaped)."""
    write_line(item.line())


def stream_api(client: Any, stack: Any, run_id: str, after: int, wait: bool, sink: Sink) -> None:
    """The run's lines from the API into ``sink``, header first, up to ``run_complete``."""
    with client.events(stack, run_id, after=after, wait=wait) as stream:
        headed = False
        for event in stream:
            if not headed and stream.header is not None:
                sink(stream.header)
                headed = True
            sink(event)
        if not headed and stream.header is not None:
            sink(stream.header)
