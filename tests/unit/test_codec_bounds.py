"""The codec's bounds: a compressed payload that inflates past ``INFLATE_LIMIT`` (a zlib
bomb) is refused by the codec server with a 413 and left undecoded in a worker (its converter
then refuses it as invalid input), inflated a chunk at a time, never held; the codec server
refuses a missing (411), negative or malformed (400) Content-Length."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.exceptions import ApplicationError

from stackflow.temporal.codec import ENCODING, INFLATE_LIMIT, data_converter
from stackflow.temporal.codec_server import serve

TOKEN = "codec-bounds-token"
BOMB_BYTES = 4 * INFLATE_LIMIT  # 512 MiB of zeros: about 500 KB compressed


def bomb(size: int = BOMB_BYTES) -> Payload:
    """A ``binary/zlib`` payload whose inner Payload's data is ``size`` zero bytes, made a
    MiB at a time (the test never holds it inflated either)."""
    header, n = bytearray(b"\x12"), size  # field 2 (data), length-delimited
    while True:
        byte, n = n & 0x7F, n >> 7
        header.append(byte | (0x80 if n else 0))
        if not n:
            break
    deflater = zlib.compressobj(9)
    parts = [deflater.compress(bytes(header))]
    zeros = bytes(2**20)
    for _ in range(size // len(zeros)):
        parts.append(deflater.compress(zeros))
    parts.append(deflater.flush())
    return Payload(metadata={"encoding": ENCODING}, data=b"".join(parts))


@pytest.fixture(scope="module")
def codec_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = serve("127.0.0.1", 0, [], TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def raw_post(address: str, path: str, head: dict[str, str], body: bytes) -> tuple[int, str]:
    """POST with exactly these headers (no Content-Length added), the body sent and the
    writing side closed; (status, the JSON error or '')."""
    host, port = address.split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {address}", f"Authorization: Bearer {TOKEN}"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    text = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(text).get("error", "") if text else ""


def document(*payloads: Payload) -> bytes:
    return json.dumps(json_format.MessageToDict(Payloads(payloads=list(payloads)))).encode()


def test_a_zlib_bomb_is_413_at_the_codec_server_and_never_inflated(codec_url: str) -> None:
    body = document(bomb())
    assert len(body) < 1024 * 1024
    tracemalloc.start()
    try:
        status, error = raw_post(codec_url, "/decode", {"Content-Length": str(len(body))}, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413, error
    assert error == (
        "payload 1: a compressed payload inflates to over 128 MiB (the payloads of one "
        "request inflate to at most 128 MiB together)"
    )
    assert peak < 32 * 2**20, peak  # the server ran in this process: chunks, not the bomb
    # a payload the limit allows still decodes
    small = asyncio.run(data_converter().encode([{"x": "y" * 100_000}]))
    status, error = raw_post(
        codec_url, "/decode", {"Content-Length": str(len(document(*small)))}, document(*small)
    )
    assert status == 200, error


@pytest.mark.parametrize(
    ("length", "status", "error"),
    [
        ("-1", 400, "Content-Length '-1' is not a byte count"),
        ("abc", 400, "Content-Length 'abc' is not a byte count"),
        ("1e3", 400, "Content-Length '1e3' is not a byte count"),
        (None, 411, "Content-Length is required"),
    ],
)
def test_a_negative_malformed_or_missing_content_length_is_refused(
    codec_url: str, length: str | None, status: int, error: str
) -> None:
    # a valid document, which a negative length read to the end of the stream (whatever its
    # size: the limit checked only ``length > MAX_BODY``); small, so it is all buffered
    # with the headers and the refusal closes cleanly
    body = document(Payload(metadata={"encoding": b"json/plain"}, data=b"1"))
    head = {"Content-Type": "application/json"}
    if length is not None:
        head["Content-Length"] = length
    assert raw_post(codec_url, "/decode", head, body) == (status, error)


def test_a_worker_leaves_a_bomb_undecoded_and_its_converter_refuses_it() -> None:
    converter = data_converter()
    payload = bomb()
    tracemalloc.start()
    try:
        with pytest.raises(ApplicationError) as err:
            asyncio.run(converter.decode([payload]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, peak
    assert err.value.type == "InvalidInput" and "binary/zlib" in err.value.message
