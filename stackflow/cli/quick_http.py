"""The smallest HTTP/1.1 client the quick answers of :mod:`stackflow.cli.quick` need: JSON
requests and an NDJSON stream to one API over one kept-alive connection, TLS verified as
httpx verifies it (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, else certifi), the headers
:class:`stackflow.client.StackflowClient` sends. It answers only the plain case: a success
with a Content-Length (or a chunked stream); anything else is :class:`NotPlain`, on which
the quick answer leaves the command to the typer app and its httpx client.

Standard library only (``socket``, ``json``; ``ssl`` for https)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

CONNECT_TIMEOUT = 10.0
TIMEOUT = 60.0
"""As :mod:`stackflow.client.http`'s: connect, and each read or write."""
MAX_HEAD = 65536
MAX_BODY = 64 * 1024 * 1024
PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
"""Set (any case), httpx would go through a proxy: the quick path does not."""


class NotPlain(Exception):
    """Not an answer the quick path handles (a transport error, a status other than the
    expected, a body that is not JSON, …): the typer app's client will say what it is.
    ``status``: the answer's HTTP status, when one came; ``body``: its first 64 KiB."""

    def __init__(self, message: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unsent(NotPlain):
    """The request did not leave: no connection could be made."""


class Dropped(NotPlain):
    """The connection failed or closed after the request was sent (it may have arrived)."""


def proxied() -> bool:
    return any(os.environ.get(n) for base in PROXY_ENV for n in (base, base.upper()))


class Http:
    """Requests to the API at ``url`` (``http[s]://host[:port][/prefix]``) with a bearer
    ``token``; ValueError for a URL or token the quick path does not take as it is."""

    def __init__(self, url: str, token: str) -> None:
        scheme, sep, rest = url.partition("://")
        host_port, slash, prefix = rest.partition("/")
        host, colon, port = host_port.partition(":")
        if (
            not sep
            or scheme not in ("http", "https")
            or any(c in url for c in "?#@[] \\%")
            or not url.isascii()
            or not host
            or (colon and not port.isdigit())
            or not (token.isascii() and token.isprintable())
        ):
            raise ValueError(url)
        self.base_url = url.rstrip("/")
        self.tls = scheme == "https"
        self.host = host
        self.port = int(port) if colon else (443 if self.tls else 80)
        self.host_header = host_port
        self.prefix = ("/" + prefix).rstrip("/") if slash else ""
        self.token = token
        self.sock: Any = None
        self.buffer = b""

    def another(self) -> Http:
        """A client of the same API on a connection of its own (a stream's is its own)."""
        return Http(self.base_url, self.token)

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        sock, self.sock, self.buffer = self.sock, None, b""
        if sock is not None:
            sock.close()

    # ---- requests --------------------------------------------------------------------------
    def get(self, path: str) -> Any:
        """The JSON of a 200 to ``GET path`` (under the URL's own path); asked once more on
        a new connection when a kept-alive one turns out closed."""
        reused = self.sock is not None
        try:
            return self._json("GET", path, None, {}, (200,))
        except Dropped:
            if not reused:
                raise
            return self._json("GET", path, None, {}, (200,))

    def post(self, path: str, body: Any, headers: dict[str, str], ok: tuple[int, ...]) -> Any:
        """The JSON of an ``ok`` answer to ``POST path`` with the JSON ``body``."""
        return self._json("POST", path, body, headers, ok)

    def lines(self, path: str, headers: dict[str, str]) -> Iterator[bytes]:
        """The lines of a 200 to ``GET path`` as they arrive (chunked or not), without a read
        timeout (an event stream has no keep-alives); the connection is closed after."""
        status, head = self._send("GET", path, None, headers)
        if status != 200:
            self.close()
            raise NotPlain(f"HTTP {status}", status)
        self.sock.settimeout(None)
        pending = b""
        try:
            for data in self._chunks(head):
                pending += data
                *complete, pending = pending.split(b"\n")
                yield from complete
            if pending:
                yield pending
        finally:
            self.close()

    def _json(
        self, method: str, path: str, body: Any, headers: dict[str, str], ok: tuple[int, ...]
    ) -> Any:
        import json

        status, head = self._send(method, path, body, headers)
        data = b"".join(self._chunks(head))
        if head.get("connection", "").lower() == "close":
            self.close()
        if status not in ok:
            raise NotPlain(f"HTTP {status}", status, data[:65536])
        try:
            return json.loads(data)
        except ValueError:
            raise NotPlain("not JSON") from None

    # ---- the wire --------------------------------------------------------------------------
    def _connect(self) -> None:
        import socket

        try:
            sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT)
            if self.tls:
                sock = self._tls_context().wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:
            raise Unsent(str(exc)) from None
        sock.settimeout(TIMEOUT)
        self.sock, self.buffer = sock, b""

    @staticmethod
    def _tls_context() -> Any:
        import ssl

        if os.environ.get("SSL_CERT_FILE"):
            return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        if os.environ.get("SSL_CERT_DIR"):
            return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
        import certifi

        return ssl.create_default_context(cafile=certifi.where())

    def _send(
        self, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, dict[str, str]]:
        """Send the request (on a new connection when none is open); the answer's status
        and headers (lower-case names)."""
        payload = b""
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Accept: */*",
            "Connection: keep-alive",
            "User-Agent: stackflow-client/1",
            f"Authorization: Bearer {self.token}",
        ]
        for name, value in headers.items():
            if not (value.isascii() and value.isprintable()):
                raise NotPlain(f"header {name}")
            lines.append(f"{name}: {value}")
        if body is not None:
            import json

            payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
        if self.sock is None:
            self._connect()
        try:
            self.sock.sendall(request)
            return self._head()
        except OSError as exc:
            self.close()
            raise Dropped(str(exc)) from None

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            self.close()
            raise Dropped("connection closed")
        return bytes(data)

    def _head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > MAX_HEAD:
                raise NotPlain("header too long")
            self.buffer += self._recv()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[0] != "HTTP/1.1" or not parts[1].isdigit():
            raise NotPlain(status_line[:80])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("content-encoding", "identity") != "identity":
            raise NotPlain("encoded body")
        return int(parts[1]), headers

    def _chunks(self, head: dict[str, str]) -> Iterator[bytes]:
        """The body's bytes as they arrive: by Content-Length, or chunked."""
        try:
            if head.get("transfer-encoding", "").lower() == "chunked":
                yield from self._chunked()
                return
            length = head.get("content-length", "")
            if not length.isdigit() or int(length) > MAX_BODY or "transfer-encoding" in head:
                raise NotPlain("no length")
            left = int(length)
            while left:
                if not self.buffer:
                    self.buffer = self._recv()
                data, self.buffer = self.buffer[:left], self.buffer[left:]
                left -= len(data)
                yield data
        except OSError as exc:
            self.close()
            raise Dropped(str(exc)) from None

    def _chunked(self) -> Iterator[bytes]:
        total = 0
        while True:
            while b"\r\n" not in self.buffer:
                if len(self.buffer) > MAX_HEAD:
                    raise NotPlain("chunk size line too long")
                self.buffer += self._recv()
            size_line, _, self.buffer = self.buffer.partition(b"\r\n")
            size_text = size_line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise NotPlain("bad chunk size") from None
            total += size
            if size < 0 or total > MAX_BODY:
                raise NotPlain("chunk too large")
            if size == 0:
                while not (self.buffer.startswith(b"\r\n") or b"\r\n\r\n" in self.buffer):
                    self.buffer += self._recv()  # trailers
                self.buffer = (
                    self.buffer[2:]
                    if self.buffer.startswith(b"\r\n")
                    else self.buffer.partition(b"\r\n\r\n")[2]
                )
                return
            while len(self.buffer) < size + 2:
                self.buffer += self._recv()
            data, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
            yield data
