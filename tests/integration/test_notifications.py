# ruff: noqa: F811  (the fixtures of test_api, imported so pytest finds them here too)
"""Outbound notifications through real HTTP (issue 22): a receiver on 127.0.0.1 gets one
signed CloudEvent per transition of an apply (started, awaiting_approval, succeeded), each
signature verified, no sensitive value in any; a destination that is down for the whole run
changes nothing about the run and leaves its deliveries in the dead-letter list (the API and
`stackflow notifications failed`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import REPO
from tests.integration.opshelp import file_resource, new_project
from tests.integration.test_api import (  # noqa: F401  (fixtures)
    api_env,
    api_url,
    api_worker,
    auth,
    http,
    wait_run,
)

pytestmark = pytest.mark.integration

SECRET = "receiver-secret-0123456789"


class Receiver:
    """Records every POST (headers and body) and answers 204."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL where connections are refused for the whole test: its port stays bound here
    without listening, so no other process can take it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def test_a_run_announces_each_transition_signed_and_a_dead_receiver_changes_nothing(
    api_env: dict[str, str],
    http: httpx.Client,
    receiver: Receiver,
    dead_url: str,
    tmp_path: Path,
) -> None:
    project = new_project()
    dead = dead_url
    targets = {
        "targets": [
            {"name": "ops", "url": receiver.url, "secret": SECRET},
            {"name": "gone", "url": dead, "secret": "another-secret-0123456"},
        ]
    }
    r = http.put(f"/v1/projects/{project}/notifications", json=targets, headers=auth("admin"))
    assert r.status_code == 200, r.text
    assert SECRET not in r.text
    shown = http.get(f"/v1/projects/{project}/notifications", headers=auth("viewer")).json()
    assert [t["name"] for t in shown] == ["ops", "gone"] and "secret" not in shown[0]
    assert (
        http.put(
            f"/v1/projects/{project}/notifications", json=targets, headers=auth("operator")
        ).status_code
        == 403
    )

    marker = f"TOPSECRET-{uuid.uuid4().hex}"
    spec = {"resources": [file_resource(tmp_path / "a.conf", f"token = {marker}\n")]}
    r = http.post(
        f"/v1/stacks/{project}/dev/runs",
        json={"operation": "apply", "spec": spec},
        headers=auth("operator"),
    )
    assert r.status_code == 201, r.text
    run = r.json()
    wait_run(http, run["status_url"], lambda v: v["phase"] == "awaitingApproval")
    assert http.post(f"{run['status_url']}/approve", headers=auth("admin")).status_code == 200
    view = wait_run(http, run["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "succeeded", view  # the dead destination changed nothing

    wanted = [
        "io.stackflow.run.started",
        "io.stackflow.run.awaiting_approval",
        "io.stackflow.run.succeeded",
    ]
    deadline = time.monotonic() + 60
    while len(receiver.got) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # nothing more comes
    events = []
    for headers, body in receiver.got:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-stackflow-signature"], expected)
        assert headers["content-type"] == "application/cloudevents+json"
        assert marker.encode() not in body
        events.append(json.loads(body))
    assert sorted(e["type"] for e in events) == sorted(wanted)
    for event in events:
        assert event["specversion"] == "1.0" and event["subject"] == run["run_id"]
        assert event["source"] == f"/stackflow/{project}/dev"
        assert event["data"]["project"] == project and event["data"]["run_id"] == run["run_id"]
    assert len({e["id"] for e in events}) == 3
    done = next(e for e in events if e["type"] == wanted[2])
    assert done["data"]["status"] == "succeeded" and done["data"]["revision"] == 1

    # the dead destination: each delivery tried, then kept in the dead-letter list
    deadline = time.monotonic() + 90
    while True:
        failed = http.get(
            f"/v1/projects/{project}/notifications/failed", headers=auth("viewer")
        ).json()
        if len(failed) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(f["type"] for f in failed) == sorted(wanted), failed
    assert {f["target"] for f in failed} == {"gone"} and {f["attempts"] for f in failed} == {4}
    assert all(f["run_id"] == run["run_id"] for f in failed)

    env = {
        k: v for k, v in api_env.items() if k not in ("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN")
    }
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "stackflow.cli.main",
            "notifications",
            "failed",
            "-p",
            project,
            "-o",
            "json",
        ],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert sorted(f["type"] for f in json.loads(cli.stdout)) == sorted(wanted)

    # drift found by a drift check is announced too
    (tmp_path / "a.conf").write_text("changed behind stackflow's back\n")
    r = http.post(
        f"/v1/stacks/{project}/dev/runs", json={"operation": "drift"}, headers=auth("operator")
    )
    assert r.status_code == 201, r.text
    wait_run(http, r.json()["status_url"], lambda v: v["status"] != "running")
    check = r.json()["run_id"]

    def of_check() -> list[tuple[dict[str, str], Any]]:
        got = [(h, json.loads(b)) for h, b in list(receiver.got)]
        return [(h, e) for h, e in got if e["subject"] == check]

    deadline = time.monotonic() + 30
    while len(of_check()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # nothing more comes
    kinds = sorted(e["type"] for _, e in of_check())
    assert kinds == ["io.stackflow.run.drift_detected", "io.stackflow.run.started"], kinds
    drift = next(e for _, e in of_check() if e["type"].endswith("drift_detected"))
    assert drift["data"]["summary"]["drifted"] == 1 and drift["data"]["revision"] == 1
    assert all(marker.encode() not in body for _, body in receiver.got)


DENY_FILES = """package stackflow

import rego.v1

deny contains {"msg": "no files in this project", "resource": c.id} if {
\tsome c in input.changes
\tc.action == "Create"
}
"""


def test_a_policy_denial_is_announced(
    api_env: dict[str, str], http: httpx.Client, receiver: Receiver, tmp_path: Path
) -> None:
    """A run the policy gate denies announces started, policy_denied (naming the policy and
    the resource) and failed, each signed, and nothing is written."""
    project = new_project()
    target = {"url": receiver.url, "secret": SECRET}
    r = http.put(f"/v1/projects/{project}/notifications/ops", json=target, headers=auth("admin"))
    assert r.status_code == 200, r.text
    marker = f"TOPSECRET-{uuid.uuid4().hex}"
    resource = file_resource(tmp_path / "denied.conf", f"token = {marker}\n")
    body = {
        "operation": "apply",
        "spec": {"resources": [resource]},
        "auto_approve": True,
        "policy": {"modules": {"no_files.rego": DENY_FILES}},
    }
    r = http.post(f"/v1/stacks/{project}/dev/runs", json=body, headers=auth("admin"))
    assert r.status_code == 201, r.text
    run = r.json()
    view = wait_run(http, run["status_url"], lambda v: v["status"] != "running")
    assert view["phase"] == "failed" and view["error_type"] == "PolicyDenied", view
    assert not (tmp_path / "denied.conf").exists()
    wanted = [
        "io.stackflow.run.started",
        "io.stackflow.run.policy_denied",
        "io.stackflow.run.failed",
    ]
    deadline = time.monotonic() + 60
    while len(receiver.got) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # nothing more comes
    events = {}
    for headers, raw in receiver.got:
        expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-stackflow-signature"], expected)
        assert marker.encode() not in raw
        event = json.loads(raw)
        events[event["type"]] = event
    assert sorted(events) == sorted(wanted)
    denied = events["io.stackflow.run.policy_denied"]["data"]
    assert denied["outcome"] == "deny" and denied["counts"] == {"deny": 1}
    [message] = denied["messages"]
    assert message["policy"] == "run/no_files.rego" and message["resource"] == resource["id"]
