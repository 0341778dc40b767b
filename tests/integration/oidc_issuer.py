"""A small OIDC issuer on loopback for the web UI's tests: its own RSA key published as a JWKS,
an authorization endpoint that shows a sign-in form (a person types their name: each known
name has its groups) and redirects back with a one-time code, and a token endpoint that trades
the code for an RS256 access token only with the PKCE verifier (S256) and the same client and
redirect URI. The API verifies those tokens exactly as any issuer's (stackflow.api.oidc)."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "stackflow"
CLIENT_ID = "stackflow-ui"


@dataclass
class Grant:
    user: str
    client_id: str
    redirect_uri: str
    challenge: str


@dataclass
class Issuer:
    users: dict[str, list[str]]
    """Name -> groups (the roles claim)."""
    url: str = ""
    key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    codes: dict[str, Grant] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    """Why each refused token request was refused."""

    def token_for(self, user: str, lifetime: int = 600) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": user,
            "groups": self.users[user],
            "iat": now,
            "exp": now + lifetime,
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "ui-test"})

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": "ui-test", "alg": "RS256", "use": "sig"}]}

    def oidc_section(self, roles: dict[str, dict[str, str]]) -> dict[str, Any]:
        """The tokens file's ``oidc:`` section that trusts this issuer."""
        return {
            "issuer": self.url,
            "audience": AUDIENCE,
            "jwks_url": f"{self.url}/jwks",
            "authorization_url": f"{self.url}/authorize",
            "token_url": f"{self.url}/token",
            "client_id": CLIENT_ID,
            "roles": roles,
        }

    def exchange(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        grant = self.codes.pop(form.get("code", ""), None)  # one use
        verifier = form.get("code_verifier", "")
        digest = hashlib.sha256(verifier.encode()).digest()
        challenge = base64.urlsafe_b64encode(digest).decode().rstrip("=")
        why = (
            "grant_type"
            if form.get("grant_type") != "authorization_code"
            else "unknown code"
            if grant is None
            else "client_id"
            if form.get("client_id") != grant.client_id
            else "redirect_uri"
            if form.get("redirect_uri") != grant.redirect_uri
            else "code_verifier"
            if not secrets.compare_digest(challenge, grant.challenge)
            else None
        )
        if why is not None or grant is None:
            self.refused.append(why or "?")
            return 400, {"error": "invalid_grant", "error_description": why}
        token = self.token_for(grant.user)
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": 600}


def serve(issuer: Issuer) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def answer(self, status: int, body: bytes, kind: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query))
            if parts.path == "/jwks":
                self.answer(200, json.dumps(issuer.jwks()).encode(), "application/json")
            elif parts.path == "/authorize":
                if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
                    self.answer(400, b"PKCE (S256) is required", "text/plain")
                    return
                hidden = "".join(
                    f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                    for k, v in query.items()
                )
                page = (
                    "<!doctype html><title>Test issuer</title><form method=post action=/authorize>"
                    f"{hidden}<label for=user>User</label><input id=user name=user>"
                    "<button id=signin type=submit>Sign in</button></form>"
                )
                self.answer(200, page.encode(), "text/html; charset=utf-8")
            else:
                self.answer(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(parse_qsl(self.rfile.read(length).decode()))
            if self.path == "/token":
                status, body = issuer.exchange(form)
                self.answer(status, json.dumps(body).encode(), "application/json")
            elif self.path == "/authorize" and form.get("user") in issuer.users:
                code = secrets.token_urlsafe(24)
                issuer.codes[code] = Grant(
                    form["user"], form["client_id"], form["redirect_uri"], form["code_challenge"]
                )
                back = f"{form['redirect_uri']}?{urlencode({'code': code, 'state': form['state']})}"
                self.answer(302, b"", "text/plain", Location=back)
            else:
                self.answer(403, b"unknown user", "text/plain")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    issuer.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
