"""The web UI's session: one cookie, signed (HMAC-SHA256 with the UI's secret), HttpOnly,
SameSite=Lax, Secure unless the page is served over plain HTTP on loopback. It holds the CSRF
token every form posts back, the signed-in person (a static token's entry name, looked up again
on every request so a removed token signs out; or an OIDC identity with the roles its access
token gave, until the session's end), and the state of a sign-in under way (OIDC ``state``
and PKCE verifier). No credential is ever kept in it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stackflow.api.auth import TokenTable
from stackflow.api.identity import Identity, Role
from stackflow.core.loopback import is_loopback

COOKIE = "stackflow_ui"
SECRET_ENV = "STACKFLOW_UI_SECRET"
SESSION_SECONDS = 8 * 3600
LOGIN_SECONDS = 600


class Login(BaseModel):
    """A sign-in at the issuer under way."""

    state: str
    verifier: str
    next: str


class Session(BaseModel):
    csrf: str = Field(default_factory=lambda: secrets.token_urlsafe(32))
    exp: float = Field(default_factory=lambda: time.time() + SESSION_SECONDS)
    user: str | None = None
    static: bool = False
    """A static token's entry: its roles are read from the token table on every request."""
    roles: dict[str, Role] = Field(default_factory=dict)
    login: Login | None = None
    flash: str | None = None
    """What the person's last step answered, shown once on the page it returns to."""

    def identity(self, tokens: TokenTable) -> Identity | None:
        if self.user is None:
            return None
        if not self.static:
            return Identity(name=self.user, roles=self.roles)
        entry = next((e for e in tokens.entries if e.name == self.user), None)
        return None if entry is None else Identity(name=entry.name, roles=dict(entry.roles))

    def check_csrf(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(self.csrf.encode(), (sent or "").encode())


def ui_secret() -> bytes:
    """``STACKFLOW_UI_SECRET`` (the same on every replica), else one of this process only."""
    configured = os.environ.get(SECRET_ENV, "")
    return configured.encode() if len(configured) >= 32 else secrets.token_bytes(32)


def _sign(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def read(request: Request, secret: bytes) -> Session | None:
    """The request's session, None without a valid, unexpired one."""
    raw = request.cookies.get(COOKIE, "")
    body, _, mac = raw.rpartition(".")
    if not body or not hmac.compare_digest(_sign(secret, body.encode()), mac):
        return None
    try:
        data: Any = json.loads(base64.urlsafe_b64decode(body.encode() + b"=" * (-len(body) % 4)))
        session = Session.model_validate(data)
    except (ValueError, ValidationError):
        return None
    return session if session.exp > time.time() else None


def write(request: Request, response: Response, session: Session, secret: bytes) -> None:
    body = base64.urlsafe_b64encode(session.model_dump_json().encode()).decode().rstrip("=")
    host = request.url.hostname or ""
    response.set_cookie(
        COOKIE,
        f"{body}.{_sign(secret, body.encode())}",
        max_age=max(1, int(session.exp - time.time())),
        path="/ui",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https" or not is_loopback(host),
    )
