"""Who may decode: the codec server refuses to listen beyond loopback without a token or
OIDC, says when it is open, and verifies OIDC access tokens against the issuer's real JWKS
(served over HTTP here) with PyJWT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from stackflow.core.crypto import new_key_line
from stackflow.temporal.codec_server import CodecAuth, CodecAuthError, serve

REPO = Path(__file__).resolve().parents[2]
STACKFLOW = Path(sys.executable).parent / "stackflow"
ISSUER, AUDIENCE = "https://idp.example", "temporal-ui"


def _codec_server(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STACKFLOW), "codec-server", *args],
        env={**os.environ, "STACKFLOW_ENCRYPTION_KEY": new_key_line("k1"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_refuses_to_listen_beyond_loopback_without_a_token_or_oidc() -> None:
    bare = {k: "" for k in os.environ if k.startswith("STACKFLOW_CODEC_")}
    proc = _codec_server("--host", "0.0.0.0", "--port", "0", env=bare)
    assert proc.returncode == 2, proc
    [line] = proc.stderr.splitlines()
    assert line.startswith("Error: codec server on 0.0.0.0: decoding for anyone who reaches it;")
    assert "STACKFLOW_CODEC_TOKEN" in line and "Traceback" not in proc.stderr
    partial = _codec_server(
        "--host", "0.0.0.0", env={**bare, "STACKFLOW_CODEC_OIDC_ISSUER": ISSUER}
    )
    assert partial.returncode == 2
    assert partial.stderr.strip() == (
        "Error: OIDC for the codec server also needs STACKFLOW_CODEC_OIDC_AUDIENCE, "
        "STACKFLOW_CODEC_OIDC_JWKS_URL"
    )


def test_open_on_loopback_says_so_when_it_starts() -> None:
    bare = {k: "" for k in os.environ if k.startswith("STACKFLOW_CODEC_")}
    proc = subprocess.Popen(
        [str(STACKFLOW), "codec-server", "--host", "127.0.0.1", "--port", "0"],
        env={**os.environ, "STACKFLOW_ENCRYPTION_KEY": new_key_line("k1"), **bare},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "open: no token or OIDC configured, any local process can decode" in line


@pytest.fixture(scope="module")
def idp() -> Iterator[tuple[str, rsa.RSAPrivateKey]]:
    """An issuer's JWKS endpoint on loopback with one RSA key (kid ``k1``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks", key
    finally:
        server.shutdown()
        server.server_close()


def _token(key: Any, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300}
    body.update(claims)
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None}, key, "RS256", headers={"kid": "k1"}
    )


def _decode_status(url: str, authorization: str | None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    request = urllib.request.Request(f"{url}/decode", b'{"payloads": []}', headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, ""
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)["error"]


def test_oidc_access_tokens_are_verified_against_the_issuers_keys(
    idp: tuple[str, rsa.RSAPrivateKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    jwks_url, key = idp
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", new_key_line("k1"))
    monkeypatch.setenv("STACKFLOW_CODEC_OIDC_ISSUER", ISSUER)
    monkeypatch.setenv("STACKFLOW_CODEC_OIDC_AUDIENCE", AUDIENCE)
    monkeypatch.setenv("STACKFLOW_CODEC_OIDC_JWKS_URL", jwks_url)
    monkeypatch.delenv("STACKFLOW_CODEC_TOKEN", raising=False)
    auth = CodecAuth.from_env()
    assert not auth.open
    # OIDC alone allows any address: the check is on the request, not the bind
    server = serve("0.0.0.0", 0, ["http://ui.example"], auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    try:
        assert _decode_status(url, f"Bearer {_token(key)}") == (200, "")
        cases = {
            "none": None,
            "expired": f"Bearer {_token(key, iat=1, exp=2)}",
            "audience": f"Bearer {_token(key, aud='someone-else')}",
            "issuer": f"Bearer {_token(key, iss='https://evil.example')}",
            "no exp": f"Bearer {_token(key, exp=None)}",
            "forged": f"Bearer {_token(other_key)}",
            "hs256": "Bearer "
            + jwt.encode(
                {"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60},
                "secret-secret-secret-secret-32by",
                "HS256",
                headers={"kid": "k1"},
            ),
            "basic": "Basic YWxpY2U6cHc=",
        }
        for name, header in cases.items():
            status, error = _decode_status(url, header)
            assert status == 401, name
            assert error and "eyJ" not in error, (name, error)  # never echoes the token
    finally:
        server.shutdown()
        server.server_close()


def test_a_static_token_and_oidc_each_open_the_door(
    idp: tuple[str, rsa.RSAPrivateKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    jwks_url, key = idp
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", new_key_line("k1"))
    from stackflow.temporal.codec_server import Oidc

    server = serve(
        "127.0.0.1",
        0,
        [],
        CodecAuth(token="s3cret", oidc=Oidc(ISSUER, AUDIENCE, jwks_url)),
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _decode_status(url, "Bearer s3cret")[0] == 200
        assert _decode_status(url, f"Bearer {_token(key)}")[0] == 200
        assert _decode_status(url, "Bearer wrong") == (401, "wrong bearer token")
    finally:
        server.shutdown()
        server.server_close()


def test_beyond_loopback_without_auth_is_refused_in_code() -> None:
    with pytest.raises(CodecAuthError):
        serve("10.1.2.3", 0, [], None)


def test_healthz_answers_without_a_token_and_decodes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Helm chart's probes: ``GET /healthz`` is 200 with no credential on a server that
    requires one; every other GET is 404 and decoding still needs the token."""
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", new_key_line("k1"))
    server = serve("0.0.0.0", 0, [], CodecAuth(token="s3cret"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as response:
            assert (response.status, json.load(response)) == (200, {"status": "ok"})
        for path in ("/decode", "/healthz/x", "/"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{url}{path}", timeout=30)
            assert err.value.code == 404, path
        assert _decode_status(url, None) == (401, "missing bearer token")
    finally:
        server.shutdown()
        server.server_close()
