"""The web UI (issue 45) in a real headless Chromium, against `stackflow serve` and a worker of
this checkout on the dev services, signing in through a real OIDC issuer on loopback
(authorization code + PKCE): the requester of a run on a four-eyes project sees it wait with
its field diff and the policy warning, and its approve button disabled saying why; a second
approver approves it in another browser, and the requester's page reaches `succeeded` from
the event stream without a reload. A viewer sees no step and a forged POST is a 403; a POST
without the CSRF token is refused; hostile text renders inert; every page sends a strict
Content-Security-Policy. The tests save the screenshots docs/images/web-ui-*.png."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.browser import Browser, chromium_binary
from tests.integration.conftest import REPO, WorkerProcess, require_env, require_port
from tests.integration.oidc_issuer import Issuer, serve
from tests.integration.opshelp import dir_resource, file_resource
from tests.integration.test_api import ApiServer

pytestmark = pytest.mark.integration

IMAGES = REPO / "docs" / "images"
VIEWER_TOKEN = "ui-viewer-token"
OPS_TOKEN = "ui-ops-token"
"""A static approver of the ``uiplain-*`` projects (not four-eyes)."""
WARN = """package stackflow

import rego.v1

warn contains {"msg": "world-readable file <b>not bold</b>", "resource": c.id} if {
	some c in input.changes
	c.action == "Create"
	c.after.mode == "0644"
}
"""
HOSTILE_NAME = "<img src=x onerror=alert(2)><b>id</b>.conf"
"""A file name, so a resource id, of HTML (no slash: it is one path segment)."""
HOSTILE = "\x1b[31m<script>alert('x')</script><img src=x onerror=alert(1)>\u202e"


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    found = Issuer(users={"alice": ["approvers"], "bob": ["approvers"], "vic": ["viewers"]})
    server = serve(found)
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def ui(
    issuer: Issuer, tmp_path_factory: pytest.TempPathFactory, integration_postgres_url: str
) -> Iterator[str]:
    """`stackflow serve` and a worker of this checkout; the worker's policy makes ``uife-*``
    four-eyes; the API trusts the issuer (approvers and viewers) and one static viewer token."""
    address = require_env("TEMPORAL_ADDRESS")
    require_port("Temporal dev server", address)
    home = tmp_path_factory.mktemp("ui-home")
    tokens = home / "tokens.json"
    section = issuer.oidc_section(
        {"approvers": {"uife-*": "approver"}, "viewers": {"uife-*": "viewer"}}
    )
    digest = hashlib.sha256(VIEWER_TOKEN.encode()).hexdigest()
    entry = {"name": "tv", "sha256": digest, "roles": {"uife-*": "viewer"}}
    ops = {
        "name": "ops",
        "sha256": hashlib.sha256(OPS_TOKEN.encode()).hexdigest(),
        "roles": {"uiplain-*": "approver"},
    }
    tokens.write_text(json.dumps({"tokens": [entry, ops], "oidc": section}))
    env = dict(os.environ)
    env.update(
        STACKFLOW_HOME=str(home),
        STACKFLOW_STATE_URL=integration_postgres_url,
        STACKFLOW_TASK_QUEUE=f"test-ui-{uuid.uuid4().hex[:8]}",
        STACKFLOW_API_TOKENS=str(tokens),
        STACKFLOW_FOUR_EYES="uife-*",
        PYTHONPATH=str(REPO),
    )
    env.setdefault("STACKFLOW_ONPREM_ROOTS", tempfile.gettempdir())
    worker = WorkerProcess(home, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    server = ApiServer(env, home / "api.log").start()
    try:
        yield server.url
    finally:
        server.stop()
        worker.stop()
    assert "Traceback" not in server.log.read_text(), server.tail()


@pytest.fixture
def browsers() -> Iterator[list[Browser]]:
    binary = chromium_binary()
    if binary is None:
        pytest.fail("chromium is not installed: run scripts/setup.sh (Debian's chromium)")
    opened: list[Browser] = []
    yield opened
    for browser in opened:
        browser.close()


def new_browser(browsers: list[Browser]) -> Browser:
    binary = chromium_binary()
    assert binary is not None
    browser = Browser(binary)
    browser.call("Page.enable")
    browser.call("Runtime.enable")
    browsers.append(browser)
    return browser


def js(browser: Browser, expression: str) -> Any:
    result = browser.call("Runtime.evaluate", expression=expression, returnByValue=True)
    assert "exceptionDetails" not in result, result
    return result.get("result", {}).get("value")


def wait_js(browser: Browser, expression: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = js(browser, expression)
        except (AssertionError, RuntimeError):
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{expression} never held; page:\n{browser.text()[:2000]}")


def sign_in(browser: Browser, ui: str, path: str, user: str) -> None:
    """Open ``path``: the UI sends the browser to sign in, the issuer's form takes the name,
    and the browser comes back to ``path`` signed in."""
    browser.open(ui + path)
    wait_js(browser, "!!document.querySelector('a[href^=\"/ui/login/oidc\"]')")
    js(browser, "document.querySelector('a[href^=\"/ui/login/oidc\"]').click()")
    wait_js(browser, "!!document.getElementById('user')")
    js(browser, f"document.getElementById('user').value = {json.dumps(user)}")
    js(browser, "document.getElementById('signin').click()")
    wait_js(browser, f"location.pathname === {json.dumps(path)}")
    browser.wait_for_text(f"Signed in as {user}")


def start_run(ui: str, issuer: Issuer, project: str, root: Path) -> str:
    """An apply started through the API by alice (her access token from the issuer)."""
    spec = {
        "resources": [
            dir_resource(root),
            file_resource(
                root / "app.conf", "port = 8080\n" + HOSTILE, deps=[f"onprem:Directory:{root}"]
            ),
            file_resource(root / HOSTILE_NAME, "x\n", deps=[f"onprem:Directory:{root}"]),
        ]
    }
    body = {
        "operation": "apply",
        "spec": spec,
        "policy": {"modules": {"ui.rego": WARN}},
        "message": HOSTILE,
    }
    r = httpx.post(
        f"{ui}/v1/stacks/{project}/default/runs",
        json=body,
        headers={"Authorization": f"Bearer {issuer.token_for('alice')}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    deadline = time.monotonic() + 90
    while True:
        view = httpx.get(
            f"{ui}/v1/stacks/{project}/default/runs/{run_id}",
            headers={"Authorization": f"Bearer {issuer.token_for('vic')}"},
            timeout=60,
        ).json()
        if view.get("phase") == "awaitingApproval":
            return run_id
        assert view["status"] == "running" and time.monotonic() < deadline, view
        time.sleep(0.3)


def test_approve_in_the_browser_and_watch_the_run_succeed(
    ui: str, issuer: Issuer, browsers: list[Browser], tmp_path: Path
) -> None:
    project = f"uife-{uuid.uuid4().hex[:8]}"
    run_id = start_run(ui, issuer, project, tmp_path / "app")
    path = f"/ui/s/{project}/default/runs/{run_id}"

    # the requester's page: waiting, the field diff, the policy warning; approve disabled
    alice = new_browser(browsers)
    sign_in(alice, ui, path, "alice")
    text = alice.wait_for_text("awaitingApproval", "port = 8080", "Policy: warn")
    assert "world-readable file <b>not bold</b>" in text  # the policy's text, as text
    assert wait_js(alice, "document.getElementById('step-approve').disabled")
    assert "four-eyes: alice started this run" in text
    assert not js(alice, "document.getElementById('step-reject').disabled")

    # hostile text is inert: no dialog opened, no element made from it, shown as text
    assert "<script>alert('x')</script>" in text and "\\u001b[31m" in text
    assert HOSTILE_NAME in text  # the resource id, in the diff and the policy's table
    assert js(alice, "document.querySelectorAll('script').length") == 1
    assert js(alice, "document.querySelectorAll('img, b').length") == 0
    assert not [e for e in alice.events if e.get("method") == "Page.javascriptDialogOpening"]
    # every field has its label; every button a name
    unlabelled = (
        "[...document.querySelectorAll('input:not([type=hidden]), textarea, select')]"
        ".filter(e => e.labels.length === 0).length"
        " + [...document.querySelectorAll('button')].filter(b => !b.textContent.trim()).length"
    )
    assert js(alice, unlabelled) == 0
    alice.screenshot(IMAGES / "web-ui-run.png")
    js(alice, "document.querySelector('table.diff').scrollIntoView()")
    alice.screenshot(IMAGES / "web-ui-diff.png")

    # the page is not reloaded from here on: a mark set now must survive
    js(alice, "window.stillHere = 'yes'")

    # a second approver approves in another browser, with a comment
    bob = new_browser(browsers)
    sign_in(bob, ui, path, "bob")
    bob.wait_for_text("awaitingApproval")
    assert not js(bob, "document.getElementById('step-approve').disabled")
    js(bob, "document.getElementById('comment').value = 'looks right'")
    js(bob, "document.getElementById('step-approve').click()")
    bob.wait_for_text("approved by bob")

    # readable at a phone's width: nothing wider than the screen
    bob.call(
        "Emulation.setDeviceMetricsOverride",
        width=390,
        height=844,
        deviceScaleFactor=1,
        mobile=True,
    )
    assert wait_js(bob, "document.documentElement.scrollWidth <= window.innerWidth")
    bob.screenshot(IMAGES / "web-ui-phone.png")

    # alice's page follows the stream to the end, never reloaded
    wait_js(alice, "document.getElementById('phase').textContent === 'succeeded'", timeout=120)
    assert js(alice, "window.stillHere") == "yes"
    assert "bob" in js(alice, "document.getElementById('status').innerText")
    assert wait_js(alice, "document.getElementById('live').textContent === 'The run has ended.'")

    # recorded as any approval is: the release names bob and keeps his comment
    release = httpx.get(
        f"{ui}/v1/stacks/{project}/default/releases/1",
        headers={"Authorization": f"Bearer {issuer.token_for('vic')}"},
        timeout=60,
    ).json()
    assert release["phase"] == "succeeded" and release["run_id"] == run_id
    assert (release["approval"]["decision"], release["approval"]["by"]) == ("approved", "bob")
    assert release["approval"]["reason"] == "looks right"


def session_of(ui: str, token: str) -> tuple[httpx.Client, str]:
    """An HTTP client signed in to the UI with a static token, and its CSRF token."""
    client = httpx.Client(base_url=ui, timeout=60, follow_redirects=True)
    page = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None, page.text
    r = client.post("/ui/login", data={"csrf": csrf.group(1), "token": token, "next": "/ui/"})
    assert r.status_code == 200 and "Signed in as" in r.text, r.text
    fresh = re.search(r'name="csrf" value="([^"]+)"', r.text)
    assert fresh is not None and fresh.group(1) != csrf.group(1)  # a new session
    return client, fresh.group(1)


def test_a_viewer_has_no_steps_a_forged_post_is_403_and_csrf_is_required(
    ui: str, issuer: Issuer, tmp_path: Path
) -> None:
    project = f"uife-{uuid.uuid4().hex[:8]}"
    run_id = start_run(ui, issuer, project, tmp_path / "app")
    path = f"/ui/s/{project}/default/runs/{run_id}"

    viewer, csrf = session_of(ui, VIEWER_TOKEN)
    page = viewer.get(path)
    assert page.status_code == 200 and "awaitingApproval" in page.text
    assert "<button" in page.text  # sign out
    assert "formaction" not in page.text and "step-approve" not in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "<script>" not in page.text.replace(
        "&lt;script&gt;", ""
    ).replace('<script src="/ui/static/ui.js" defer></script>', "")
    # a forged approve with a valid session and CSRF token: the role decides
    forged = viewer.post(f"{path}/approve", data={"csrf": csrf, "comment": "me"})
    assert forged.status_code == 403 and "this needs approver" in forged.text
    # without the CSRF token (or with another), nothing is taken
    assert viewer.post(f"{path}/approve", data={"comment": "x"}).status_code == 403
    assert viewer.post(f"{path}/approve", data={"csrf": "x" * 43}).status_code == 403
    # no session at all: sent to sign in, nothing done
    anonymous = httpx.post(f"{ui}{path}/reject", data={"csrf": csrf}, follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/ui/login")
    viewer.close()

    # an approver's POST without the CSRF token is refused too; with it, it is taken
    bob = httpx.Client(base_url=ui, timeout=60, follow_redirects=True)
    with bob:
        cookie = oidc_session(ui, issuer, bob, "bob")
        refused = bob.post(f"{path}/reject", data={"comment": "no"})
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert "awaitingApproval" in bob.get(path).text
        done = bob.post(f"{path}/reject", data={"comment": "no", "csrf": cookie})
        assert done.status_code == 200 and "rejected by bob" in done.text


def oidc_session(ui: str, issuer: Issuer, client: httpx.Client, user: str) -> str:
    """Sign ``client`` in through the issuer as a browser does; the session's CSRF token."""
    to_issuer = client.get("/ui/login/oidc?next=/ui/", follow_redirects=False)
    assert to_issuer.status_code == 303
    location = to_issuer.headers["location"]
    assert (
        location.startswith(f"{issuer.url}/authorize?") and "code_challenge_method=S256" in location
    )
    form = dict(httpx.URL(location).params)
    back = httpx.post(f"{issuer.url}/authorize", data={**form, "user": user})
    assert back.status_code == 302
    # a forged state is refused; the real one signs in
    target = httpx.URL(back.headers["location"])
    forged = client.get(str(target.copy_set_param("state", "forged")))
    assert forged.status_code == 400
    home = client.get(str(target))
    assert home.status_code == 200 and f"Signed in as <strong>{user}</strong>" in home.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', home.text)
    assert csrf is not None
    return csrf.group(1)


def finished(ui: str, project: str, body: dict[str, Any]) -> dict[str, Any]:
    """Run ``body`` on the project as ops (auto-approved) and wait for its end."""
    headers = {"Authorization": f"Bearer {OPS_TOKEN}"}
    r = httpx.post(f"{ui}/v1/stacks/{project}/default/runs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    url = f"{ui}{r.json()['status_url']}"
    deadline = time.monotonic() + 90
    while True:
        view: dict[str, Any] = httpx.get(url, headers=headers, timeout=60).json()
        if view["status"] != "running":
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.3)


def test_releases_their_diff_masked_a_paginated_preview_and_only_viewable_stacks(
    ui: str, tmp_path: Path
) -> None:
    project = f"uiplain-{uuid.uuid4().hex[:8]}"
    base = f"/ui/s/{project}/default"
    root = tmp_path / "app"
    secrets = [f"ui-{uuid.uuid4().hex[:8]}-Sup3r", f"ui-{uuid.uuid4().hex[:8]}-Sup3r"]
    applied = []
    for n, secret in enumerate(secrets):
        spec = {
            "context": {"env": {"UI_TOKEN": secret}},
            "resources": [
                dir_resource(root),
                file_resource(root / "a.conf", f"v = {n}\n", deps=[f"onprem:Directory:{root}"]),
            ],
        }
        view = finished(ui, project, {"operation": "apply", "spec": spec, "auto_approve": True})
        assert view["phase"] == "succeeded", view
        applied.append(view["run_id"])

    ops, _ = session_of(ui, OPS_TOKEN)
    pages = {
        path: ops.get(path)
        for path in (
            f"{base}/releases",
            f"{base}/releases/1",
            f"{base}/releases/2",
            f"{base}/diff?old=1&new=2",
            base,
            "/ui/",
        )
    }
    for path, page in pages.items():
        assert page.status_code == 200, (path, page.text)
        assert "default-src 'none'" in page.headers["content-security-policy"]
        for secret in secrets:
            assert secret not in page.text, path
    diff = pages[f"{base}/diff?old=1&new=2"].text
    assert "v = 0" in diff and "v = 1" in diff and "UI_TOKEN" in diff
    assert "(sensitive value)" in diff
    assert f"onprem:File:{root}/a.conf" in pages[f"{base}/releases/2"].text
    assert project in pages["/ui/"].text

    # a preview of 120 files (and the 2 deletions of the former ones): 50 a page
    files = [file_resource(root / f"f{i:03}.conf", f"n = {i}\n") for i in range(120)]
    view = finished(ui, project, {"operation": "preview", "spec": {"resources": files}})
    run = f"{base}/runs/{view['run_id']}"
    first, last = ops.get(run), ops.get(f"{run}?page=3")
    assert "Page 1 of 3 (122 resources listed)" in first.text
    assert "f000.conf" in first.text and "f050.conf" not in first.text
    assert "f119.conf" in last.text and "n = 119" in last.text and "f099.conf" not in last.text
    assert f"onprem:File:{root}/a.conf" in last.text  # a deletion, last
    assert 'rel="prev"' in last.text and 'rel="next"' not in last.text

    # the runs, with their phase, filtered by phase and operation
    listed = ops.get(base).text
    assert all(run_id in listed for run_id in [*applied, view["run_id"]])
    succeeded = ops.get(f"{base}?phase=succeeded").text
    assert all(run_id in succeeded for run_id in applied) and view["run_id"] not in succeeded
    previews = ops.get(f"{base}?operation=preview").text
    assert view["run_id"] in previews and applied[0] not in previews
    assert not any(run_id in ops.get(f"{base}?phase=failed").text for run_id in applied)
    ops.close()

    # the viewer of uife-* sees no uiplain-* stack, and may not open one
    viewer, _ = session_of(ui, VIEWER_TOKEN)
    assert project not in viewer.get("/ui/").text
    refused = viewer.get(f"{base}/releases")
    assert refused.status_code == 403 and "no role on project" in refused.text
    viewer.close()
