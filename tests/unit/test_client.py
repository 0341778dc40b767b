"""The typed API client (stackflow.client) against a stubbed transport: problems become the
typed errors with the CLI's exit codes, the event stream is parsed (header checked, resumed
after a dropped connection without a gap or a repeat), and the package stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stackflow.client import (
    ApiConflict,
    ApiForbidden,
    ApiInvalid,
    ApiNotFound,
    ApiProtocolError,
    ApiStackLocked,
    ApiUnauthorized,
    ApiUnavailable,
    StackflowClient,
)
from stackflow.core.refs import StackRef
from tests.unit.client_fakes import FakeTransport, Reply, Sent

STACK = StackRef("demo", "dev")
RUN = "0198a0c2-0000-7000-8000-000000000001"
HEADER = {
    "stream": "stackflow.events",
    "version": 1,
    "project": "demo",
    "workspace": "dev",
    "workflow_id": "stackflow/demo/dev",
    "run_id": RUN,
}


def client(handler: Callable[[Sent], Reply]) -> StackflowClient:
    return StackflowClient("http://api.test/", "tok", transport=FakeTransport(handler))


def problem(status: int, kind: str, detail: str) -> Reply:
    return Reply(
        status,
        json={
            "type": f"urn:stackflow:problem:{kind}",
            "title": "x",
            "status": status,
            "detail": detail,
        },
        headers={"Content-Type": "application/problem+json"},
    )


def event(seq: int, type: str, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "type": type, "time": "2025-01-02T03:04:05.123456+00:00", **data}


def ndjson(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.mark.parametrize(
    ("status", "kind", "cls", "exit_code"),
    [
        (401, "unauthorized", ApiUnauthorized, 2),
        (403, "forbidden", ApiForbidden, 2),
        (404, "not-found", ApiNotFound, 1),
        (409, "stack-locked", ApiStackLocked, 3),
        (409, "refused", ApiConflict, 1),
        (413, "content-too-large", ApiInvalid, 2),
        (422, "invalid-input", ApiInvalid, 2),
        (503, "temporal-unavailable", ApiUnavailable, 1),
    ],
)
def test_problems_are_typed_errors_with_the_clis_exit_codes(
    status: int, kind: str, cls: type[Exception], exit_code: int
) -> None:
    api = client(lambda request: problem(status, kind, "the one   line\nthe CLI prints"))
    with pytest.raises(cls) as raised:
        api.get_run(STACK, RUN)
    err: Any = raised.value
    assert str(err) == "the one line the CLI prints"
    assert (err.status, err.kind, err.exit_code) == (status, kind, exit_code)


def test_start_sends_only_the_fields_given_with_an_idempotency_key() -> None:
    seen: list[Sent] = []

    def handler(request: Sent) -> Reply:
        seen.append(request)
        return Reply(
            201,
            json={
                "run_id": RUN,
                "workflow_id": "stackflow/demo/dev",
                "operation": "apply",
                "status_url": f"/v1/stacks/demo/dev/runs/{RUN}",
                "events_url": "/e",
            },
        )

    created = client(handler).start_run(
        STACK, {"operation": "apply", "spec": {"resources": []}, "auto_approve": True}
    )
    assert created.run_id == RUN
    [request] = seen
    assert request.path == "/v1/stacks/demo/dev/runs"
    assert request.headers["Authorization"] == "Bearer tok"
    assert request.headers["Idempotency-Key"].startswith("stackflow-client-")
    assert json.loads(request.content) == {
        "operation": "apply",
        "spec": {"resources": []},
        "auto_approve": True,
    }


def test_a_start_without_an_answer_is_sent_again_with_the_same_key() -> None:
    keys: list[str] = []

    def handler(request: Sent) -> Reply:
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            raise ConnectionRefusedError(111, "Connection refused")
        return Reply(
            200,
            json={
                "run_id": RUN,
                "workflow_id": "w",
                "operation": "destroy",
                "status_url": "/x",
                "events_url": "/e",
            },
        )

    client(handler).start_run(STACK, {"operation": "destroy"}, idempotency_key="k-1")
    assert keys == ["k-1", "k-1"]


def test_unreachable_api_is_one_line() -> None:
    def handler(request: Sent) -> Reply:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ApiUnavailable, match=r"stackflow API at http://api.test unreachable"):
        client(handler).list_runs(STACK)


def test_events_parse_header_then_typed_events_until_run_complete() -> None:
    body = ndjson(
        HEADER,
        event(1, "run_start", operation="apply", total=1),
        event(2, "apply_complete", resource={"id": "a", "type": "OnPrem"}, action="Create"),
        event(3, "run_complete", status="succeeded", revision=1, error=None),
        event(4, "phase", phase="never read"),
    )
    api = client(lambda request: Reply(200, content=body))
    stream = api.events(STACK, RUN)
    events = list(stream)
    assert [e.type for e in events] == ["run_start", "apply_complete", "run_complete"]
    assert stream.header is not None and stream.header.run_id == RUN
    assert events[1].data["resource"]["id"] == "a"
    # the line a client prints is the line the server sent
    assert events[1].line() == json.dumps(
        event(2, "apply_complete", resource={"id": "a", "type": "OnPrem"}, action="Create"),
        separators=(",", ":"),
    )


def test_a_dropped_stream_resumes_after_the_last_event() -> None:
    asked: list[str | None] = []

    def dropping() -> Iterator[bytes]:
        yield ndjson(HEADER, event(1, "run_start", total=2))
        raise ConnectionResetError(104, "connection reset")

    def handler(request: Sent) -> Reply:
        asked.append(request.params.get("after"))
        if len(asked) == 1:
            return Reply(200, chunks=dropping())
        return Reply(
            200, content=ndjson(HEADER, event(2, "run_complete", status="failed", error="x"))
        )

    events = list(client(handler).events(STACK, RUN))
    assert [e.seq for e in events] == [1, 2]
    assert asked == ["0", "1"]


def test_wait_false_is_sent_and_a_problem_on_the_stream_is_typed() -> None:
    def handler(request: Sent) -> Reply:
        assert request.params.get("wait") == "false"
        return problem(404, "not-found", f"stack demo/dev has no run {RUN}")

    with pytest.raises(ApiNotFound, match="has no run"):
        list(client(handler).events(STACK, RUN, wait=False))


def test_a_stream_of_another_version_is_refused() -> None:
    body = ndjson({**HEADER, "version": 2})
    with pytest.raises(ApiProtocolError, match="version 2"):
        list(client(lambda r: Reply(200, content=body)).events(STACK, RUN))


def test_from_env_needs_a_token() -> None:
    with pytest.raises(ApiInvalid, match="STACKFLOW_API_TOKEN is not"):
        StackflowClient.from_env({"STACKFLOW_API_URL": "http://x"})


def test_importing_the_client_loads_neither_the_server_the_engine_nor_pydantic() -> None:
    code = (
        "import sys, stackflow.client; "
        "print(sorted(m for m in ('temporalio', 'fastapi', 'starlette', 'sqlalchemy', "
        "'pydantic', 'httpx', 'stackflow.api', 'stackflow.engine', 'stackflow.model') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
