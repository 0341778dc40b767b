"""``stackflow codec-server``: Temporal's remote codec protocol over HTTP, so the Temporal Web
UI and ``temporal … --codec-endpoint`` show stackflow's compressed and encrypted payloads.

``POST /encode`` and ``POST /decode`` take and return ``{"payloads": [...]}`` (proto3 JSON);
CORS answers the UI's origin only; ``GET /healthz`` answers ``{"status": "ok"}`` to anyone
(liveness and readiness probes). Decoding needs the keys (``STACKFLOW_ENCRYPTION_KEY`` /
``_FILE``): whoever can reach this endpoint can read payloads. So requests carry
``Authorization: Bearer <credential>``, a static token (``STACKFLOW_CODEC_TOKEN``) or an OIDC
access token (a JWT verified against the issuer's keys: ``STACKFLOW_CODEC_OIDC_ISSUER``,
``_AUDIENCE``, ``_JWKS_URL``; the Temporal UI passes its users' token with
``TEMPORAL_CODEC_PASS_ACCESS_TOKEN``). A server with neither binds to loopback only (the dev
loop) and says so when it starts; on any other address it refuses to start.

It never calls Temporal (clients bring it payloads). It serves HTTPS itself with
``STACKFLOW_CODEC_TLS_CERT`` and ``STACKFLOW_CODEC_TLS_KEY`` (PEM paths, read at start; TLS 1.2
or newer), else plain HTTP, for loopback or behind a TLS-terminating proxy or ingress.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from stackflow.core.errors import StackflowError
from stackflow.core.loopback import is_loopback
from stackflow.temporal.codec import PayloadTooLarge, payload_codec

log = logging.getLogger("stackflow.temporal.codec_server")
MAX_BODY = 8 * 1024 * 1024
"""Largest request body (``Content-Length``, required: else 411; over it, 413). The payloads
of one request inflate to at most :data:`stackflow.temporal.codec.INFLATE_LIMIT` together (else
413), so a zlib bomb is refused, never held in memory."""
READ_TIMEOUT = 60.0
"""Seconds a connection may sit without sending (a body slower than that is dropped)."""
JWT_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384"]
"""Asymmetric only: a JWT signed with a shared secret (HS*) or none is never accepted."""


class CodecAuthError(StackflowError):
    """The codec server's authentication settings are missing or inconsistent."""

    exit_code = 2


class Oidc:
    """Verifies OIDC access tokens (JWTs) of one issuer and audience against its JWKS."""

    def __init__(self, issuer: str, audience: str, jwks_url: str) -> None:
        self.issuer, self.audience = issuer, audience
        # fetched once, and again only for a key id it does not know
        self._keys = jwt.PyJWKClient(jwks_url, lifespan=300, timeout=5)

    def verify(self, token: str) -> str | None:
        """None when ``token`` is a valid, unexpired JWT of this issuer and audience, else
        why not (one line, never the token)."""
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            jwt.decode(
                token,
                key.key,
                algorithms=JWT_ALGORITHMS,
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp", "iss", "aud"]},
                leeway=30,
            )
        except jwt.PyJWKClientConnectionError:
            return "the OIDC issuer's keys cannot be fetched"
        except jwt.PyJWTError as err:
            return f"not a valid access token: {err}"
        return None


@dataclass(frozen=True)
class CodecAuth:
    """Who may use the codec server: a static token, OIDC access tokens, or (loopback) anyone."""

    token: str | None = None
    oidc: Oidc | None = None

    @classmethod
    def from_env(cls) -> CodecAuth:
        oidc = {
            "STACKFLOW_CODEC_OIDC_ISSUER": os.environ.get("STACKFLOW_CODEC_OIDC_ISSUER", ""),
            "STACKFLOW_CODEC_OIDC_AUDIENCE": os.environ.get("STACKFLOW_CODEC_OIDC_AUDIENCE", ""),
            "STACKFLOW_CODEC_OIDC_JWKS_URL": os.environ.get("STACKFLOW_CODEC_OIDC_JWKS_URL", ""),
        }
        verifier = None
        if any(v.strip() for v in oidc.values()):
            missing = [name for name, value in oidc.items() if not value.strip()]
            if missing:
                raise CodecAuthError(f"OIDC for the codec server also needs {', '.join(missing)}")
            verifier = Oidc(*(v.strip() for v in oidc.values()))
        return cls(token=os.environ.get("STACKFLOW_CODEC_TOKEN") or None, oidc=verifier)

    @property
    def open(self) -> bool:
        return self.token is None and self.oidc is None

    def describe(self) -> str:
        if self.open:
            return "open: no token or OIDC configured, any local process can decode"
        ways = ["bearer token"] * (self.token is not None)
        if self.oidc is not None:
            ways.append(f"OIDC tokens of {self.oidc.issuer} for {self.oidc.audience}")
        return "requires " + " or ".join(ways)

    def refusal(self, header: str) -> str | None:
        """None when the ``Authorization`` header is accepted, else why not."""
        if self.open:
            return None
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            return "missing bearer token"
        if self.token is not None and hmac.compare_digest(credential.encode(), self.token.encode()):
            return None
        if self.oidc is not None and credential.count(".") == 2:
            return self.oidc.verify(credential)
        return "wrong bearer token"


def make_handler(
    codec: PayloadCodec, origins: Sequence[str], auth: CodecAuth
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "stackflow-codec"
        timeout = READ_TIMEOUT

        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

        def _cors(self) -> None:
            origin = self.headers.get("Origin")
            if origin and origin in origins:
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Access-Control-Allow-Credentials", "true")
                self.send_header("Vary", "Origin")

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self._cors()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_OPTIONS(self) -> None:
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
            self.send_header(
                "Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization"
            )
            self.send_header("Access-Control-Max-Age", "600")
            self.end_headers()

        def do_GET(self) -> None:
            # The one unauthenticated answer: that the process serves (probes, load
            # balancers). It says nothing about keys or payloads.
            if self.path.split("?", 1)[0] == "/healthz":
                self._reply(200, {"status": "ok"})
                return
            self._reply(404, {"error": "GET /healthz, POST /encode or /decode"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if not path.endswith(("/encode", "/decode")):
                self._reply(404, {"error": "POST /encode or /decode"})
                return
            refused = auth.refusal(self.headers.get("Authorization", ""))
            if refused is not None:
                self._reply(401, {"error": refused})
                return
            text = (self.headers.get("Content-Length") or "").strip()
            if not text:
                self._reply(411, {"error": "Content-Length is required"})
                return
            if not text.isdigit() or not text.isascii() or len(text) > 12:
                self._reply(400, {"error": f"Content-Length {text[:40]!r} is not a byte count"})
                return
            length = int(text)
            if length > MAX_BODY:
                self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
                return
            try:
                request = Payloads()
                json_format.Parse(self.rfile.read(length) or b"{}", request)
                run = codec.encode if path.endswith("/encode") else codec.decode
                result: list[Payload] = asyncio.run(run(list(request.payloads)))
            except json_format.ParseError as err:
                self._reply(400, {"error": f"not a payloads document: {err}"})
                return
            except PayloadTooLarge as err:
                self._reply(413, {"error": str(err)})
                return
            except StackflowError as err:
                self._reply(400, {"error": str(err)})
                return
            self._reply(200, json_format.MessageToDict(Payloads(payloads=result)))

    return Handler


def serve(
    host: str, port: int, origins: Sequence[str], auth: CodecAuth | str | None
) -> ThreadingHTTPServer:
    """A started-but-not-serving server (call ``serve_forever``); keys from the environment.

    ``auth`` may be a static token. Refuses (``CodecAuthError``) to listen beyond loopback
    without a token or OIDC."""
    if not isinstance(auth, CodecAuth):
        auth = CodecAuth(token=auth)
    if auth.open and not is_loopback(host):
        raise CodecAuthError(
            f"codec server on {host}: decoding for anyone who reaches it; set "
            "STACKFLOW_CODEC_TOKEN or STACKFLOW_CODEC_OIDC_ISSUER/_AUDIENCE/_JWKS_URL, "
            "or listen on 127.0.0.1"
        )
    context = tls_context()
    codec = payload_codec(strict=True)  # a payload over INFLATE_LIMIT is a 413
    server = ThreadingHTTPServer((host, port), make_handler(codec, origins, auth))
    server.daemon_threads = True
    if context is not None:
        # the handshake runs in the request's thread, on its first read (not in accept)
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    return server


TLS_CERT_ENV = "STACKFLOW_CODEC_TLS_CERT"
TLS_KEY_ENV = "STACKFLOW_CODEC_TLS_KEY"


def tls_context() -> ssl.SSLContext | None:
    """The server's TLS (``STACKFLOW_CODEC_TLS_CERT`` and ``_KEY``, both or neither), or None
    for plain HTTP; a bad setting is one ``CodecAuthError`` line at start."""
    cert = os.environ.get(TLS_CERT_ENV, "").strip()
    key = os.environ.get(TLS_KEY_ENV, "").strip()
    if not cert and not key:
        return None
    if not cert or not key:
        raise CodecAuthError(f"HTTPS needs both {TLS_CERT_ENV} and {TLS_KEY_ENV} (PEM files)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        reason = getattr(err, "strerror", None) or getattr(err, "reason", None) or err
        raise CodecAuthError(
            f"{TLS_CERT_ENV}={cert}, {TLS_KEY_ENV}={key}: cannot load them ({reason})"
        ) from None
    return context
