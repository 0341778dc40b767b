"""Signing in to the web UI: at the OIDC issuer the API trusts (authorization-code flow with
PKCE, S256; the access token it gives is verified exactly as an API credential is, by
:class:`~stackflow.api.oidc.OidcVerifier`), or with a static API token (the dev setup). Each
sign-in starts a new session (a new CSRF token); signing out ends it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Annotated
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from stackflow.api.oidc import InvalidToken, OidcVerifier
from stackflow.api.problems import Problem
from stackflow.api.ui import session
from stackflow.api.ui.base import UiRoute, ctx_of, current, error_page, form, render, secret_of

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
TOKEN_TIMEOUT = 10.0
Next = Annotated[str, Query(max_length=2000)]


def safe_next(target: str) -> str:
    """Where to go after signing in: a path of the UI, never another site."""
    ok = target.startswith("/ui/") and not target.startswith(("//", "/ui//")) and "\\" not in target
    return target if ok else "/ui/"


def sso(request: Request) -> OidcVerifier | None:
    """The issuer the API trusts, when its section names the endpoints a browser signs in at."""
    oidc = ctx_of(request).tokens.oidc
    if oidc is None or not (oidc.config.authorization_url and oidc.config.token_url):
        return None
    return oidc


def signed_in_as(request: Request, fresh: session.Session, target: str) -> Response:
    response = RedirectResponse(safe_next(target), 303)
    session.write(request, response, fresh, secret_of(request))
    return response


@router.get("/login")
async def login_page(request: Request, next: Next = "/ui/") -> Response:
    found = current(request)[0] or session.Session()
    response = render(
        request,
        "login.html",
        sso=sso(request) is not None,
        next=safe_next(next),
        login_csrf=found.csrf,
    )
    session.write(request, response, found, secret_of(request))
    return response


@router.post("/login")
async def token_login(request: Request) -> Response:
    """Sign in with a static API token (its entry's name and roles)."""
    found, _ = current(request)
    fields = await form(request)
    if found is None or not found.check_csrf(fields.get("csrf")):
        raise Problem(403, "the form's CSRF token is missing or wrong: reload the page", "csrf")
    identity = ctx_of(request).tokens.static(fields.get("token", "").strip())
    if identity is None:
        return error_page(request, 401, "that token is not one this server accepts")
    fresh = session.Session(user=identity.name, static=True)
    return signed_in_as(request, fresh, fields.get("next", "/ui/"))


def challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@router.get("/login/oidc")
async def oidc_login(request: Request, next: Next = "/ui/") -> Response:
    """To the issuer's authorization endpoint (a code, S256 PKCE, a state bound to this
    browser's session)."""
    oidc = sso(request)
    if oidc is None:
        raise Problem(404, "single sign-on is not configured (oidc.authorization_url)", "not-found")
    found = current(request)[0] or session.Session()
    found.login = session.Login(
        state=secrets.token_urlsafe(24), verifier=secrets.token_urlsafe(48), next=safe_next(next)
    )
    config = oidc.config
    query = urlencode(
        {
            "response_type": "code",
            "client_id": config.client_id or config.audience,
            "redirect_uri": str(request.url_for("ui_callback")),
            "scope": "openid",
            "state": found.login.state,
            "code_challenge": challenge(found.login.verifier),
            "code_challenge_method": "S256",
        }
    )
    response = RedirectResponse(f"{config.authorization_url}?{query}", 303)
    session.write(request, response, found, secret_of(request))
    return response


@router.get("/auth/callback", name="ui_callback")
async def callback(
    request: Request,
    code: Annotated[str, Query(max_length=4096)] = "",
    state: Annotated[str, Query(max_length=200)] = "",
    error: Annotated[str, Query(max_length=200)] = "",
) -> Response:
    """The issuer sends the browser back here: trade the code for an access token, verify it
    as the API does, and start the person's session."""
    oidc = sso(request)
    found = current(request)[0]
    login = found.login if found else None
    if oidc is None or login is None or not hmac.compare_digest(login.state, state):
        return error_page(request, 400, "this sign-in was not started here: sign in again")
    if error or not code:
        return error_page(request, 401, f"the identity provider refused: {error or 'no code'}")
    config = oidc.config
    assert config.token_url is not None
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": str(request.url_for("ui_callback")),
        "client_id": config.client_id or config.audience,
        "code_verifier": login.verifier,
    }
    try:
        async with httpx.AsyncClient(timeout=TOKEN_TIMEOUT) as http:
            answer = await http.post(config.token_url, data=data)
        body = answer.json() if answer.status_code == 200 else None
        token = body.get("access_token") if isinstance(body, dict) else None
    except (httpx.HTTPError, ValueError) as err:
        detail = f"cannot reach the token endpoint {config.token_url}: {err}"
        raise Problem(503, detail, "identity-provider-unavailable") from None
    if not isinstance(token, str):
        return error_page(request, 401, f"the token endpoint answered {answer.status_code}")
    try:
        identity = await run_in_threadpool(oidc.verify, token)
    except InvalidToken as err:
        return error_page(request, 401, f"the issuer's access token is not valid here: {err}")
    fresh = session.Session(user=identity.name, roles=identity.roles)
    return signed_in_as(request, fresh, login.next)


@router.post("/logout")
async def logout(request: Request) -> Response:
    found, _ = current(request)
    fields = await form(request)
    if found is None or not found.check_csrf(fields.get("csrf")):
        raise Problem(403, "the form's CSRF token is missing or wrong: reload the page", "csrf")
    response = RedirectResponse("/ui/login", 303)
    response.delete_cookie(session.COOKIE, path="/ui")
    return response
