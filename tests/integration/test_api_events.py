# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""The event stream of a run through real HTTP: a 300-resource apply read by a client that
disconnects at random points and resumes on another replica (SSE with ``Last-Event-ID``),
then on an API process killed and started again (NDJSON with ``?after``): every event exactly
once, in order, one ``apply_complete`` per resource and one ``run_complete`` at the end. And
a run ended by Temporal (terminated) gets its ``run_complete`` from the reader."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import dir_resource, file_resource, new_project
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    ApiServer,
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    is_problem,
    small_spec,
    wait_run,
)

pytestmark = pytest.mark.integration

TYPES = {
    "run_start",
    "phase",
    "planned_change",
    "change_summary",
    "approval_wait",
    "apply_start",
    "apply_complete",
    "apply_errored",
    "run_complete",
}


def read_ndjson(
    url: str,
    path: str,
    *,
    after: int | None = None,
    stop_after: int | None = None,
    wait: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the events of one NDJSON connection (closed after ``stop_after``
    events, as a client that goes away)."""
    params: dict[str, Any] = {} if after is None else {"after": after}
    if not wait:
        params["wait"] = "false"
    events: list[dict[str, Any]] = []
    with (
        httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=120)) as client,
        client.stream("GET", path, params=params, headers=auth("viewer")) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = r.iter_lines()
        header = json.loads(next(lines))
        for line in lines:
            if not line:
                continue
            events.append(json.loads(line))
            if stop_after is not None and len(events) >= stop_after:
                break
    return header, events


def read_sse(url: str, path: str, *, last_event_id: int, stop_after: int) -> list[dict[str, Any]]:
    """Events of one SSE connection resumed with ``Last-Event-ID`` (closed after
    ``stop_after``), each message's id checked against its data."""
    events: list[dict[str, Any]] = []
    headers = auth("viewer") | {"Accept": "text/event-stream", "Last-Event-ID": str(last_event_id)}
    with (
        httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=120)) as client,
        client.stream("GET", path, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        message: dict[str, str] = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                continue  # keep-alive
            if line:
                name, _, value = line.partition(": ")
                message[name] = value
                continue
            if message.get("event") == "stream":
                assert json.loads(message["data"])["version"] == 1
            elif message:
                event = json.loads(message["data"])
                assert int(message["id"]) == event["seq"] and message["event"] == event["type"]
                events.append(event)
                if len(events) >= stop_after:
                    break
            message = {}
    return events


def test_300_resource_apply_every_event_once_across_replicas_and_a_restart(
    api_env: dict[str, str],
    api_url: str,
    api_worker: WorkerProcess,
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    project = new_project()
    root = tmp_path / "many"
    directory = f"onprem:Directory:{root}"
    resources = [dir_resource(root)] + [
        file_resource(root / f"f{i:03}.conf", f"n = {i}\n", deps=[directory]) for i in range(299)
    ]
    r = http.post(
        f"/v1/stacks/{project}/dev/runs",
        json={"operation": "apply", "spec": {"resources": resources}},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    status_url = r.json()["status_url"]
    path = status_url + "/events"
    wait_run(http, status_url, lambda v: v["phase"] == "awaitingApproval")
    assert http.post(f"{status_url}/approve", headers=auth("admin")).status_code == 200

    # 1: replica A (the module's server), NDJSON from the start, gone at a random point
    header, first = read_ndjson(api_url, path, stop_after=rnd.randint(5, 320))
    assert header["stream"] == "stackflow.events" and header["version"] == 1
    assert header["run_id"] == r.json()["run_id"] and header["project"] == project
    # 2: replica B, SSE resumed with Last-Event-ID, gone at another random point
    replica = ApiServer(api_env, tmp_path / "replica-b.log").start()
    try:
        second = read_sse(
            replica.url, path, last_event_id=first[-1]["seq"], stop_after=rnd.randint(5, 200)
        )
    finally:
        replica.kill()
    # 3: replica B killed and started again on its port; NDJSON resumed with ?after
    restarted = ApiServer(api_env, tmp_path / "replica-b-again.log", port=replica.port).start()
    try:
        _, third = read_ndjson(restarted.url, path, after=second[-1]["seq"])
    finally:
        restarted.stop()

    events = first + second + third
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1)), f"seed {seed}: gap or duplicate"
    assert {e["type"] for e in events} <= TYPES
    assert events[0]["type"] == "run_start" and events[0]["total"] == 300
    assert events[-1]["type"] == "run_complete", f"seed {seed}"
    assert events[-1]["status"] == "succeeded" and events[-1]["revision"] == 1
    counts = Counter(e["type"] for e in events)
    assert counts["run_complete"] == 1 and counts["apply_errored"] == 0
    assert counts["change_summary"] == 1 and counts["approval_wait"] == 1
    ids = [r["id"] for r in resources]
    for kind in ("apply_start", "apply_complete", "planned_change"):
        per_resource = Counter(e["resource"]["id"] for e in events if e["type"] == kind)
        assert per_resource == Counter(ids), f"{kind}: not one per resource (seed {seed})"
    summary = next(e for e in events if e["type"] == "change_summary")
    assert (summary["add"], summary["change"], summary["remove"]) == (300, 0, 0)
    phases = [e["phase"] for e in events if e["type"] == "phase"]
    assert phases == ["previewing", "applying", "succeeded"]
    # order: planned before the wait, the wait before any apply, every start before its end
    where = {(e["type"], e.get("resource", {}).get("id")): e["seq"] for e in events}
    wait = where[("approval_wait", None)]
    assert all(where[("planned_change", i)] < wait < where[("apply_start", i)] for i in ids)
    assert all(where[("apply_start", i)] < where[("apply_complete", i)] for i in ids)
    assert all(
        isinstance(e["elapsed_seconds"], float) for e in events if e["type"] == "apply_complete"
    )
    for log in (tmp_path / "replica-b.log", tmp_path / "replica-b-again.log"):
        assert "Traceback" not in log.read_text()


async def test_a_terminated_run_ends_its_stream_with_run_complete(
    http: httpx.Client, temporal_client: Client, tmp_path: Path
) -> None:
    """A run ended by Temporal (terminate: no code of the run runs) still ends its stream;
    a second reader gets the very same last event; ``wait=false`` returns at once."""
    project = new_project()
    r = http.post(
        f"/v1/stacks/{project}/dev/runs",
        json={"operation": "apply", "spec": {"resources": [dir_resource(tmp_path / "t")]}},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    created = r.json()
    wait_run(http, created["status_url"], lambda v: v["phase"] == "awaitingApproval")
    path = created["status_url"] + "/events"
    _, now = read_ndjson(str(http.base_url), path, wait=False)
    assert [e["type"] for e in now][-1] == "approval_wait"

    handle = temporal_client.get_workflow_handle(created["workflow_id"], run_id=created["run_id"])
    await handle.terminate("test: terminated from outside")
    started = time.monotonic()
    _, events = read_ndjson(str(http.base_url), path)
    assert time.monotonic() - started < 30
    last = events[-1]
    assert last["type"] == "run_complete" and last["status"] == "failed"
    assert last["source"] == "temporal" and "terminated" in last["error"]
    _, again = read_ndjson(str(http.base_url), path, after=0)
    assert again == events


def test_a_caller_over_its_stream_cap_gets_429_and_a_closed_stream_frees_its_slot(
    api_env: dict[str, str], api_worker: WorkerProcess, tmp_path: Path
) -> None:
    """With at most two streams per caller: the viewer's third concurrent stream is a 429
    problem+json (another caller is not held back), and once one of its streams has ended
    (read to its end) a new one is served."""
    env = {**api_env, "STACKFLOW_API_MAX_STREAMS": "2"}
    server = ApiServer(env, tmp_path / "api.log").start()
    try:
        with httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=120)) as http:
            r = http.post(
                f"/v1/stacks/{new_project()}/dev/runs",
                json={"operation": "apply", "spec": small_spec(tmp_path)},
                headers=auth("operator"),
            )
            assert r.status_code == 201, r.text
            run = r.json()
            wait_run(http, run["status_url"], lambda v: v["phase"] == "awaitingApproval")
            path = run["events_url"]
            with (
                http.stream("GET", path, headers=auth("viewer")) as one,
                http.stream("GET", path, headers=auth("viewer")) as two,
            ):
                assert one.status_code == two.status_code == 200
                lines = one.iter_lines()
                assert json.loads(next(lines))["stream"] == "stackflow.events"
                third = http.get(path, headers=auth("viewer"))
                detail = is_problem(third, 429)["detail"]
                assert detail.startswith("viewer already has 2 event streams open")
                assert "STACKFLOW_API_MAX_STREAMS" in detail
                assert third.headers["retry-after"] == "5"
                # another caller has slots of its own
                other = http.get(path, params={"wait": "false"}, headers=auth("admin"))
                assert other.status_code == 200, other.text
                # the run ends: stream one ends after run_complete, and its slot is free
                rejected = http.post(f"{run['status_url']}/reject", headers=auth("admin"))
                assert rejected.status_code == 200, rejected.text
                seen = [json.loads(line)["type"] for line in lines if line]
                assert seen[-1] == "run_complete"
                again = http.get(path, headers=auth("viewer"))
                assert again.status_code == 200, again.text
                assert json.loads(again.text.splitlines()[-1])["type"] == "run_complete"
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text(), server.tail()
