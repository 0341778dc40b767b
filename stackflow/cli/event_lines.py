"""A run's event stream as lines on stdout (`stackflow events`, and ``--output ndjson`` of the
run commands): a line per event for a person, the stream's own lines, or one JSON document,
from the API's stream. Standard library only."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from stackflow.cli.api_mode import api_client
from stackflow.core.errors import NotFoundError
from stackflow.core.terminal import one_line_safe

Item = Any
"""A stream's header or event, the client's light types."""
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


def describe(event: Any) -> str:
    """What one event says, for a person."""
    d: dict[str, Any] = event.data
    resource = (d.get("resource") or {}).get("id", "")
    action = d.get("action", "")
    match str(event.type):
        case "run_start":
            by = f" by {d['requested_by']}" if d.get("requested_by") else ""
            rev = f"revision {d['revision']}, " if d.get("revision") is not None else ""
            return f"{d.get('operation', 'run')}{by}: {rev}{d.get('total', 0)} node(s)"
        case "phase":
            return f"phase {d.get('phase')}"
        case "planned_change":
            return f"{action} {resource}" + (" (drift)" if d.get("drift") else "")
        case "change_summary":
            return (
                f"{d.get('add', 0)} to add, {d.get('change', 0)} to change, "
                f"{d.get('remove', 0)} to remove, {d.get('unchanged', 0)} unchanged"
            )
        case "approval_wait":
            what = (
                "approval (approve / reject)"
                if d.get("wait") == "approval"
                else ("a decision on failed nodes (retry / abort)")
            )
            return f"waiting for {what}"
        case "apply_start":
            return f"{action} {resource}"
        case "apply_complete":
            return f"{action} {resource} done ({d.get('elapsed_seconds')}s)"
        case "apply_errored":
            return f"{action} {resource} failed: {d.get('error')}"
        case "run_complete":
            rev = f" (release {d['revision']})" if d.get("revision") is not None else ""
            error = f": {d['error']}" if d.get("error") else ""
            return f"{d.get('status')}{rev}{error}"
    return json.dumps(d, sort_keys=True)


def human_line(event: Any) -> str:
    when = event.time.astimezone().strftime("%H:%M:%S")
    return one_line_safe(f"{event.seq:>5} {when} {event.type!s:<15} {describe(event)}")


class Collect:
    """``--output json``: one document at the end, ``{"stream": header, "events": [...]}``."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []

    def __call__(self, item: Item) -> None:
        if is_header(item):
            self.header = json.loads(item.line())
        else:
            self.events.append(item.wire())

    def dump(self) -> None:
        data = {"stream": self.header, "events": self.events}
        write_line(json.dumps(data, indent=2, ensure_ascii=False))


def table_sink(item: Item) -> None:
    if is_header(item):
        write_line(one_line_safe(f"run {item.run_id} of {item.project}/{item.workspace}"))
    else:
        write_line(human_line(item))


def api_events(
    stack: Any, run_id: str | None, after: int, wait: bool, sink: Sink, patience: float = 0.0
) -> None:
    with api_client(patience) as client:
        if run_id is None:
            page = client.list_runs(stack, page_size=1)
            if not page.runs:
                raise NotFoundError(f"stack {stack} has no runs")
            run_id = page.runs[0].run_id
        stream_api(client, stack, run_id, after, wait, sink)
