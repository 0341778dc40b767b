"""The API in the CLI's own process: what `stackflow` talks to when ``STACKFLOW_API_URL`` is not
set. The typed client is the CLI's only transport either way; here it sends its requests to
the API's ASGI app on an event loop of this process (:class:`LocalTransport`), built on the
Temporal and state backend of the environment. So a command runs the same code, with the same
checks, answers and exit codes, whether it goes through `stackflow serve` or not (as
``argocd --core`` runs Argo CD's API server in the CLI).

The caller is the local user (what runs record as their requester) with the approver role on
every project: what a user who reaches Temporal and the state backend could do anyway. The
worker's own rules (four-eyes, project scopes, its policy) hold as for any caller."""

from __future__ import annotations

import asyncio
import hashlib
import os
import queue
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

from temporalio.client import Client

from stackflow.api.app import create_app
from stackflow.api.auth import TokenEntry, TokenTable
from stackflow.api.identity import Role
from stackflow.engine.spec import MAX_SPEC_BYTES

BASE_URL = "local:"
"""How the client names the API in its messages when it is this process's own."""

_END = object()


class LocalAnswer:
    """An answer of the app: status and headers once it started, its body as it comes."""

    def __init__(
        self, status: int, headers: dict[str, str], body: queue.Queue[Any], gone: threading.Event
    ) -> None:
        self.status, self.headers, self._body = status, headers, body
        self._closed = gone
        """Set when the client closes the answer: the app then sees the disconnect."""

    def _chunks(self) -> Iterator[bytes]:
        while not self._closed.is_set():
            chunk = self._body.get()
            if chunk is _END:
                return
            if isinstance(chunk, BaseException):
                raise OSError(f"the API failed: {chunk}") from chunk
            yield chunk

    def read(self) -> bytes:
        return b"".join(self._chunks())

    def lines(self) -> Iterator[bytes]:
        rest = b""
        for chunk in self._chunks():
            rest += chunk
            *whole, rest = rest.split(b"\n")
            yield from (line + b"\n" for line in whole)
        if rest:
            yield rest

    def close(self) -> None:
        self._closed.set()
        self._body.put(_END)


class LocalTransport:
    """The client's transport to the API app in this process (``send`` and ``close`` of
    :class:`stackflow.client.transport.Transport`); its token names the local user."""

    def __init__(self, user: str) -> None:
        from stackflow.state.backend import open_backend
        from stackflow.temporal.client import connect, quiet_runtime
        from stackflow.temporal.codec import data_converter
        from stackflow.temporal.tls import TemporalTLS

        TemporalTLS.from_env()  # bad TLS settings: their own line (exit 2) before anything
        self.token = os.urandom(24).hex()
        caller = TokenEntry(
            name=user,
            sha256=hashlib.sha256(self.token.encode()).hexdigest(),
            roles={"*": Role.approver},
        )

        async def connect_temporal() -> Client:
            from stackflow.temporal import tracing

            return await connect(
                data_converter(command=True),  # no key here: one error line, no log
                runtime=quiet_runtime(),
                interceptors=tracing.interceptors(tracing.CLI),
            )

        # a request is the size of the spec file this process reads (as it always could)
        self.app = create_app(
            connect_temporal,
            open_backend(),
            TokenTable([caller]),
            max_body_bytes=MAX_SPEC_BYTES + 1024 * 1024,
            ui=False,  # no pages here: the CLI's process serves only itself
        )
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="local-api", daemon=True).start()

    def send(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        timeout: float | None,
        stream: bool = False,
    ) -> LocalAnswer:
        path, _, query = target.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
            ],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        head: queue.Queue[Any] = queue.Queue()
        chunks: queue.Queue[Any] = queue.Queue()
        gone = threading.Event()
        request = [{"type": "http.request", "body": body or b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if request:
                return request.pop()
            while not gone.is_set():  # the answer is read until the client closes it
                await asyncio.sleep(0.2)
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                pairs = message.get("headers") or []
                head.put((message["status"], {k.decode(): v.decode() for k, v in pairs}))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put(bytes(message["body"]))
                if not message.get("more_body"):
                    chunks.put(_END)

        async def serve() -> None:
            try:
                await self.app(scope, receive, send)
            except BaseException as exc:  # after its own 500 (or before any answer)
                head.put(exc)
                chunks.put(exc)

        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        try:
            started = head.get(timeout=timeout)
        except queue.Empty:
            gone.set()
            raise TimeoutError(f"no answer within {timeout:g}s") from None
        if isinstance(started, BaseException):
            raise OSError(f"the API failed: {started}") from started
        status, answer_headers = started
        return LocalAnswer(status, answer_headers, chunks, gone)

    def close(self) -> None:
        """Nothing to close: the loop's thread ends with the process."""
