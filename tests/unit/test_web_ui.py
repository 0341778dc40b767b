"""The web UI's session, sign-in and page guards without Temporal (issue 45): the signed
session cookie (tampered, expired or another server's: no session), its attributes (HttpOnly,
SameSite=Lax, Secure off loopback), CSRF on every POST, a static token removed signs its
sessions out, where a sign-in may send the browser back to, PKCE's S256 challenge, control
characters shown inert, and the security headers on every answer, errors included."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.requests import Request
from temporalio.client import Client

from stackflow.api.app import create_app
from stackflow.api.auth import TokenTable, parse_tokens, token_hash
from stackflow.api.oidc import OidcConfig
from stackflow.api.ui import base, session, signin
from stackflow.state.backend import open_backend


def table(*names: str) -> TokenTable:
    entries = [
        {"name": n, "sha256": token_hash(f"{n}-token"), "roles": {"p-*": "approver"}} for n in names
    ]
    return parse_tokens(json.dumps(entries))


def app_with(tmp_path: Path, tokens: TokenTable, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    monkeypatch.setenv(session.SECRET_ENV, "s" * 40)

    async def connect() -> Client:
        raise AssertionError("these pages need no Temporal")

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}", migrate=True)
    return create_app(connect, backend, tokens)


def signed_in(client: TestClient, name: str) -> str:
    """Sign in with the static token; the new session's CSRF token."""
    page = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    done = client.post("/ui/login", data={"csrf": csrf.group(1), "token": f"{name}-token"})
    assert done.status_code == 200 and f"Signed in as <strong>{name}</strong>" in done.text
    fresh = re.search(r'name="csrf" value="([^"]+)"', done.text)
    assert fresh is not None and fresh.group(1) != csrf.group(1)
    return fresh.group(1)


def test_sign_in_cookie_csrf_and_sign_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = TestClient(app_with(tmp_path, table("ann"), monkeypatch), base_url="http://127.0.0.1")
    first = client.get("/ui/", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/ui/login?next=%2Fui%2F"
    login = client.get("/ui/login")
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback
    # the token form without its CSRF token, and a wrong token, sign no one in
    assert client.post("/ui/login", data={"token": "ann-token"}).status_code == 403
    csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert csrf is not None
    assert (
        client.post("/ui/login", data={"csrf": csrf.group(1), "token": "nope"}).status_code == 401
    )
    token = signed_in(client, "ann")
    assert client.post("/ui/logout", data={}).status_code == 403  # no CSRF: still signed in
    assert "Signed in as" in client.get("/ui/").text
    out = client.post("/ui/logout", data={"csrf": token}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_the_cookie_is_secure_off_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = TestClient(app_with(tmp_path, table("ann"), monkeypatch), base_url="http://ui.example")
    assert "Secure" in client.get("/ui/login").headers["set-cookie"]


def test_a_tampered_expired_or_foreign_session_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = app_with(tmp_path, table("ann"), monkeypatch)
    client = TestClient(app, base_url="http://127.0.0.1")
    signed_in(client, "ann")
    value = client.cookies[session.COOKIE]
    body, mac = value.rsplit(".", 1)

    def opens(cookie: str) -> bool:
        client.cookies.set(session.COOKIE, cookie, path="/ui")
        return client.get("/ui/", follow_redirects=False).status_code == 200

    assert opens(value)
    forged = session.Session(user="ann", static=True, roles={"*": 3}).model_dump_json()
    other = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
    assert not opens(f"{other}.{mac}")  # another body under the old signature
    assert not opens(f"{body}.{'0' * 64}")
    assert not opens("garbage")
    # an expired session, written as the server writes one (with its secret)
    response = base.HTMLResponse("")
    scope = {
        "type": "http",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "path": "/ui/",
        "headers": [],
    }
    expired = session.Session(user="ann", static=True, exp=time.time() - 1)
    session.write(Request(scope), response, expired, b"s" * 40)
    assert not opens(response.headers["set-cookie"].split(";")[0].split("=", 1)[1])
    assert opens(value)


def test_a_removed_static_token_signs_its_sessions_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas with the same STACKFLOW_UI_SECRET share sessions; one whose token table
    no longer has the entry does not know the person."""
    first = TestClient(
        app_with(tmp_path, table("ann", "bo"), monkeypatch), base_url="http://127.0.0.1"
    )
    signed_in(first, "ann")
    twin = TestClient(app_with(tmp_path, table("ann"), monkeypatch), base_url="http://127.0.0.1")
    twin.cookies = first.cookies
    assert twin.get("/ui/", follow_redirects=False).status_code == 200
    without = TestClient(app_with(tmp_path, table("bo"), monkeypatch), base_url="http://127.0.0.1")
    without.cookies = first.cookies
    assert without.get("/ui/", follow_redirects=False).status_code == 303


def test_headers_on_every_answer_errors_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = TestClient(app_with(tmp_path, table("ann"), monkeypatch), base_url="http://127.0.0.1")
    signed_in(client, "ann")
    for path, status in (
        ("/ui/", 200),
        ("/ui/static/ui.js", 200),
        ("/ui/static/nope.js", 404),
        ("/ui/s/other/default/releases", 403),
        ("/ui/s/p-1/default/releases/0", 422),
    ):
        r = client.get(path)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-security-policy"] == base.CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        if status != 200:
            assert r.headers["content-type"].startswith("text/html") and "Traceback" not in r.text
    assert "unsafe" not in base.CSP and "default-src 'none'" in base.CSP


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("/ui/s/p/default", True),
        ("/ui/", True),
        ("https://evil.example/", False),
        ("//evil.example/ui/", False),
        ("/ui//evil.example", False),
        ("/ui/\\evil", False),
        ("/v1/stacks", False),
    ],
)
def test_sign_in_returns_only_to_the_ui(target: str, kept: bool) -> None:
    assert signin.safe_next(target) == (target if kept else "/ui/")


def test_pkce_challenge_is_s256() -> None:
    # RFC 7636, appendix B
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert signin.challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_control_characters_are_shown_inert() -> None:
    page = base.templates.from_string("<p>{{ v }}</p>").render(v="\x1b[31m<b>x</b>\u202e\tok\n")
    assert page == "<p>\\u001b[31m&lt;b&gt;x&lt;/b&gt;\\u202e\tok\n</p>"


def test_the_sign_in_endpoints_are_https_or_loopback() -> None:
    good = {"issuer": "i", "audience": "a", "jwks_url": "https://idp.example/jwks"}
    OidcConfig.model_validate({**good, "authorization_url": "http://127.0.0.1:9/authorize"})
    for field in ("authorization_url", "token_url"):
        with pytest.raises(ValidationError, match="https"):
            OidcConfig.model_validate({**good, field: "http://idp.example/x"})


def test_a_kept_preview_is_only_its_own_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run page keeps a settled preview by stack and run id: a viewer of another project
    cannot read it through their own stack's path."""
    from stackflow.api.ui import pages
    from stackflow.core.refs import StackRef

    client = TestClient(app_with(tmp_path, table("ann"), monkeypatch), base_url="http://127.0.0.1")
    signed_in(client, "ann")  # approver on p-*, nothing on secret-*
    run_id = "0190f0a0-0000-7000-8000-000000000001"
    kept = {"changes": [{"id": "kept-marker", "type": "T", "action": "Create"}], "summary": {}}
    monkeypatch.setattr(pages, "SETTLED", type(pages.SETTLED)())
    pages.settled((StackRef("secret-x", "default"), run_id), kept)
    mine = client.get(f"/ui/s/p-1/default/runs/{run_id}/preview")
    assert "kept-marker" not in mine.text and mine.status_code != 200
    pages.settled((StackRef("p-1", "default"), run_id), kept)
    assert "kept-marker" in client.get(f"/ui/s/p-1/default/runs/{run_id}/preview").text
