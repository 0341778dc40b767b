"""``stackflow codec-server``: Temporal's remote codec protocol over HTTP, so the Temporal Web
UI and ``temporal … --codec-endpoint`` show stackflow's compressed and encrypted payloads.

``POST /encode`` and ``POST /decode`` take and return ``{"payloads": [...]}`` (proto3 JSON);
CORS answers the UI's origin only; with a token set, requests must carry
``Authorization: Bearer <token>``. Decoding needs the keys (``STACKFLOW_ENCRYPTION_KEY`` /
``_FILE``): whoever can reach this endpoint can read payloads, so it binds to loopback by
default and should sit behind the same access control as the UI.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from stackflow.codec import payload_codec
from stackflow.errors import StackflowError

log = logging.getLogger("stackflow.codec_server")
MAX_BODY = 8 * 1024 * 1024


def make_handler(
    codec: PayloadCodec, origins: Sequence[str], token: str | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "stackflow-codec"

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

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if not path.endswith(("/encode", "/decode")):
                self._reply(404, {"error": "POST /encode or /decode"})
                return
            if token is not None:
                given = self.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    self._reply(401, {"error": "missing or wrong bearer token"})
                    return
            length = int(self.headers.get("Content-Length") or 0)
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
            except StackflowError as err:
                self._reply(400, {"error": str(err)})
                return
            self._reply(200, json_format.MessageToDict(Payloads(payloads=result)))

    return Handler


def serve(host: str, port: int, origins: Sequence[str], token: str | None) -> ThreadingHTTPServer:
    """A started-but-not-serving server (call ``serve_forever``); keys from the environment."""
    server = ThreadingHTTPServer((host, port), make_handler(payload_codec(), origins, token))
    server.daemon_threads = True
    return server
