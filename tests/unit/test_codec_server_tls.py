"""The codec server over HTTPS (``STACKFLOW_CODEC_TLS_CERT`` / ``_KEY``): it never calls
Temporal, so its own listener is what TLS protects (the bearer token and the decoded
payloads). A client that trusts the CA decodes; plain HTTP gets no answer; a half or unreadable
setting stops it at start with one line (exit 2)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackflow.core.crypto import new_key_line
from stackflow.temporal.codec_server import CodecAuth, serve
from tests.tlscerts import Pki, make_pki

REPO = Path(__file__).resolve().parents[2]
STACKFLOW = Path(sys.executable).parent / "stackflow"
TOKEN = "codec-token-for-tls"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("codec-pki"))


@pytest.fixture
def https_url(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", new_key_line("k1"))
    monkeypatch.setenv("STACKFLOW_CODEC_TLS_CERT", str(pki.server.cert))
    monkeypatch.setenv("STACKFLOW_CODEC_TLS_KEY", str(pki.server.key))
    server = serve("127.0.0.1", 0, ["http://127.0.0.1:8233"], CodecAuth(token=TOKEN))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def encode(url: str, context: ssl.SSLContext | None) -> dict[str, object]:
    body = {"payloads": [{"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "e30="}]}
    request = urllib.request.Request(
        url + "/encode",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        result: dict[str, object] = json.loads(answer.read())
        return result


def test_a_client_trusting_the_ca_encodes_over_https(https_url: str, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    encoded = encode(f"https://{https_url}", context)
    [payload] = encoded["payloads"]  # type: ignore[misc]
    assert payload["metadata"]["encoding"] == "YmluYXJ5L2VuY3J5cHRlZA=="  # binary/encrypted


def test_plain_http_and_an_untrusted_client_get_nothing(https_url: str) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        encode(f"http://{https_url}", None)
    with pytest.raises(urllib.error.URLError) as err:
        encode(f"https://{https_url}", ssl.create_default_context())
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)


def test_half_or_unreadable_settings_stop_it_at_start(pki: Pki, tmp_path: Path) -> None:
    def start(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STACKFLOW), "codec-server", "--port", "0"],
            env={**os.environ, "STACKFLOW_ENCRYPTION_KEY": new_key_line("k1"), **env},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )

    half = start(STACKFLOW_CODEC_TLS_CERT=str(pki.server.cert), STACKFLOW_CODEC_TLS_KEY="")
    assert half.returncode == 2, half
    assert half.stderr.strip() == (
        "Error: HTTPS needs both STACKFLOW_CODEC_TLS_CERT and STACKFLOW_CODEC_TLS_KEY (PEM files)"
    )
    missing = tmp_path / "missing.key"
    bad = start(STACKFLOW_CODEC_TLS_CERT=str(pki.server.cert), STACKFLOW_CODEC_TLS_KEY=str(missing))
    assert bad.returncode == 2, bad
    [line] = bad.stderr.splitlines()
    assert line.startswith("Error: STACKFLOW_CODEC_TLS_CERT=") and "cannot load them" in line
