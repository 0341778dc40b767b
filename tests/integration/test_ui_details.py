"""What the Temporal Web UI shows of a run, in a real browser (Debian's headless Chromium):
the run's current details (phase, counts, the exact command to approve) and its summary; its
input decoded through the codec server, and only ciphertext when the codec is unreachable."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
from temporalio.client import Client

from stackflow.core.refs import StackRef
from stackflow.temporal.operation import (
    ApprovalInput,
    OperationInput,
    OperationResult,
    workflow_id_for,
)
from tests.integration.browser import Browser, chromium_binary
from tests.integration.conftest import REPO, WorkerProcess
from tests.integration.opshelp import file_resource, new_project, wait_phase

ARTIFACTS = REPO / ".run" / "artifacts"


async def test_the_ui_shows_the_runs_details_and_how_to_approve(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    binary = chromium_binary()
    if binary is None:
        pytest.fail("chromium is not installed: run `make setup` (Debian package chromium)")
    project = new_project()
    spec = {"resources": [file_resource(tmp_path / f"f{i}", f"{i}\n") for i in range(3)]}
    handle = await temporal_client.start_workflow(
        "ApplyWorkflow",
        OperationInput(project=project, spec=spec),
        id=workflow_id_for(StackRef(project, "default")),
        task_queue=stack_env["STACKFLOW_TASK_QUEUE"],
        result_type=OperationResult,
        static_summary=f"apply {project}/default: 3 resources",
    )
    await wait_phase(handle, "awaitingApproval")
    ui = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = urllib.parse.quote(handle.id, safe="")
    url = f"{ui}/namespaces/default/workflows/{wid}/{handle.result_run_id}/user-metadata"
    browser = Browser(binary)
    try:
        browser.open(url)
        text = browser.wait_for_text(
            f"apply {project}/default: phase awaitingApproval",
            "3 create, 0 update, 0 delete, 0 unchanged",
            f"stackflow approve --project {project} --workspace default",
            f"apply {project}/default: 3 resources",  # the static summary
            timeout=60,
        )
        assert "temporal workflow update execute" in text
        browser.screenshot(ARTIFACTS / "ui-current-details.png")
    finally:
        browser.close()
    assert (ARTIFACTS / "ui-current-details.png").stat().st_size > 10_000
    await decoded_in_the_ui_ciphertext_without_the_codec(
        handle.id, handle.result_run_id, project, str(tmp_path / "f1")
    )
    await handle.execute_update("approve", ApprovalInput(by="ui-test"))
    assert (await handle.result()).phase == "succeeded"


async def decoded_in_the_ui_ciphertext_without_the_codec(
    workflow_id: str, run_id: str | None, project: str, plaintext: str
) -> None:
    """The dev UI decodes payloads through the codec server: the run's history page shows its
    input in clear. The same page in a browser that cannot reach the codec server (its
    requests to the codec endpoint fail in the network layer, as when the server is down or
    not run) shows only the encrypted payload, byte for byte the ciphertext of the raw
    history (`temporal workflow show` without --codec-endpoint), and none of the input."""
    assert os.environ.get("STACKFLOW_ENCRYPTION_KEY_FILE"), "the dev loop encrypts payloads"
    codec = os.environ.get("STACKFLOW_CODEC_ENDPOINT", "http://127.0.0.1:18081").rstrip("/")
    raw = subprocess.run(
        ["temporal", "workflow", "show", "--workflow-id", workflow_id, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert raw.returncode == 0, raw.stderr
    events = json.loads(raw.stdout)["events"]
    started = events[0]["workflowExecutionStartedEventAttributes"]
    [payload] = started["input"]["payloads"]
    encoding = payload["metadata"]["encoding"]
    assert base64.b64decode(encoding) == b"binary/encrypted"
    assert project.encode() not in base64.b64decode(payload["data"])
    assert plaintext.encode() not in base64.b64decode(payload["data"])

    ui = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = urllib.parse.quote(workflow_id, safe="")
    history = f"{ui}/namespaces/default/workflows/{wid}/{run_id}/history"
    in_clear = (f'"project": "{project}"', plaintext)
    binary = chromium_binary()
    assert binary is not None
    browser = Browser(binary)
    try:
        browser.open(history)
        text = browser.wait_for_text("Input", *in_clear, timeout=60)
        # the page decodes event by event: once the input shows, the others follow
        deadline = time.monotonic() + 30
        while ("binary/encrypted" in text or encoding in text) and time.monotonic() < deadline:
            time.sleep(0.5)
            text = browser.text()
        assert "binary/encrypted" not in text and encoding not in text
        assert payload["data"] not in text
        assert "Codec Server could not connect" not in text
        browser.screenshot(ARTIFACTS / "ui-decoded-input.png")
    finally:
        browser.close()

    browser = Browser(binary)
    try:
        browser.block(f"{codec}/*")
        browser.open(history)
        # The input as the UI shows an undecoded payload: its metadata (base64 of
        # "binary/encrypted" and the key id) and the ciphertext.
        text = browser.wait_for_text(
            "Input", "Codec Server could not connect", encoding, payload["data"], timeout=60
        )
        for clear in in_clear:
            assert clear not in text, f"the undecoded page shows {clear!r}"
        # UI 2.54 adds a query (?preserveStorageRefs=true); the codec server ignores queries
        asked = {url.split("?", 1)[0] for url in browser.blocked_requests()}
        assert f"{codec}/decode" in asked, "the UI never asked the codec"
        browser.screenshot(ARTIFACTS / "ui-ciphertext-input.png")
    finally:
        browser.close()
