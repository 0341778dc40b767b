"""Encryption of payloads: AES-256-GCM with key ids, rotation, clear errors on a wrong key
or altered bytes; the chain compression → encryption; the codec server over real HTTP."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from stackflow.core.crypto import EncryptionKeyError, KeyRing, new_key_line, write_key_file
from stackflow.temporal.codec import ENCRYPTED, KEY_ID, data_converter, payload_codec
from stackflow.temporal.codec_server import serve

A, B = new_key_line("a"), new_key_line("b")


def test_rotation_reads_old_data_and_writes_with_the_new_key(tmp_path: Path) -> None:
    old = KeyRing.parse(A, "test")
    kid, blob = old.encrypt(b"secret", b"ctx")
    rotated = KeyRing.parse(f"{B},{A}", "test")  # B current, A kept
    assert rotated.current == "b" and rotated.decrypt(kid, blob, b"ctx") == b"secret"
    assert rotated.encrypt(b"x")[0] == "b"
    write_key_file(tmp_path / "keys.json", rotated)
    assert (tmp_path / "keys.json").stat().st_mode & 0o777 == 0o600
    assert KeyRing.load_file(tmp_path / "keys.json") == rotated


def test_a_wrong_or_missing_key_or_altered_bytes_is_one_clear_error() -> None:
    ring = KeyRing.parse(A, "test")
    kid, blob = ring.encrypt(b"secret", b"ctx")
    other_a = KeyRing.parse(new_key_line("a"), "test")
    with pytest.raises(EncryptionKeyError, match="does not decrypt with key 'a'"):
        other_a.decrypt(kid, blob, b"ctx")
    with pytest.raises(EncryptionKeyError, match="encrypted with key 'a', which this process"):
        KeyRing.parse(B, "test").decrypt(kid, blob, b"ctx")
    with pytest.raises(EncryptionKeyError, match="altered or copied"):
        ring.decrypt(kid, blob[:-1] + bytes([blob[-1] ^ 1]), b"ctx")
    with pytest.raises(EncryptionKeyError, match="altered or copied"):
        ring.decrypt(kid, blob, b"another row")  # bound to its associated data


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nokey", "expected <id>:<base64 key>"),
        ("a:notbase64!", "is not base64"),
        (f"a:{base64.b64encode(b'short').decode()}", "is 5 bytes; AES-256 needs 32"),
        ("bad id:" + A.split(":")[1], "must be letters"),
    ],
    ids=["no-key", "not-base64", "short-key", "bad-id"],  # the same on every collection
)
def test_malformed_keys(text: str, message: str) -> None:
    with pytest.raises(EncryptionKeyError, match=message):
        KeyRing.parse(text, "STACKFLOW_ENCRYPTION_KEY")


async def test_payloads_are_compressed_then_encrypted_and_plain_ones_still_read() -> None:
    ring = KeyRing.parse(A, "test")
    converter = data_converter(ring)
    value = {"spec": {"resources": [{"id": f"r{i}", "data": "x" * 100} for i in range(500)]}}
    [payload] = await converter.encode([value])
    assert payload.metadata["encoding"] == ENCRYPTED and payload.metadata[KEY_ID] == b"a"
    assert b"r499" not in payload.data and payload.ByteSize() < 10_000  # compressed first
    assert await converter.decode([payload], [dict]) == [value]
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"project":"p"}')
    assert await converter.decode([plain], [dict]) == [{"project": "p"}]
    with pytest.raises(EncryptionKeyError):
        await data_converter(KeyRing.parse(B, "test")).decode([payload], [dict])


@pytest.fixture
def codec_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", A)
    server = serve("127.0.0.1", 0, ["http://ui.example"], "s3cret")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post(url: str, body: object, token: str | None = "s3cret") -> tuple[int, dict[str, str], dict]:
    headers = {"Content-Type": "application/json", "Origin": "http://ui.example"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.load(err)


async def test_codec_server_decodes_what_workers_encode(codec_server: str) -> None:
    encoded = await payload_codec(KeyRing.parse(A, "test")).encode(
        [Payload(metadata={"encoding": b"json/plain"}, data=b'{"secret": "hunter2"}' * 1000)]
    )
    from google.protobuf import json_format
    from temporalio.api.common.v1 import Payloads

    body = json_format.MessageToDict(Payloads(payloads=encoded))
    status, headers, answer = post(f"{codec_server}/decode", body)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://ui.example"
    [decoded] = answer["payloads"]
    assert base64.b64decode(decoded["data"]).startswith(b'{"secret": "hunter2"}')
    # the Web UI (2.54+) asks with a query; the answer is the same
    assert post(f"{codec_server}/decode?preserveStorageRefs=true", body)[2] == answer
    status, _, again = post(f"{codec_server}/encode", answer)
    assert (
        status == 200
        and again["payloads"][0]["metadata"]["encoding"] == base64.b64encode(ENCRYPTED).decode()
    )
    assert post(f"{codec_server}/decode", body, token=None)[0] == 401
    assert post(f"{codec_server}/decode", body, token="wrong")[0] == 401
    preflight = urllib.request.Request(
        f"{codec_server}/decode", method="OPTIONS", headers={"Origin": "http://evil.example"}
    )
    with urllib.request.urlopen(preflight) as response:
        assert "Access-Control-Allow-Origin" not in response.headers
