"""HTTP/1.1 to one API with the standard library (``http.client``): a kept-alive connection
for calls, a connection of its own for each event stream, TLS verified as httpx verifies it
(``SSL_CERT_FILE``, ``SSL_CERT_DIR``, else certifi's bundle), and the proxy of the
environment (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``, ``NO_PROXY``).

:class:`HttpTransport` is what :class:`stackflow.client.StackflowClient` sends through; a
test gives the client another object with the same ``send`` and ``close``."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import socket
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

CONNECT_TIMEOUT = 10.0
PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")


class Answer(Protocol):
    """An answer: its status, headers (lower-case names), and its body."""

    status: int
    headers: dict[str, str]

    def read(self) -> bytes: ...

    def lines(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def send(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        timeout: float | None,
        stream: bool = False,
    ) -> Answer: ...

    def close(self) -> None: ...


class Response:
    """An ``http.client`` answer (and, for a stream, the connection it closes with it)."""

    def __init__(
        self, response: http.client.HTTPResponse, own: http.client.HTTPConnection | None
    ) -> None:
        self._response, self._own = response, own
        self.status = response.status
        self.headers = {name.lower(): value for name, value in response.getheaders()}

    def read(self) -> bytes:
        return self._response.read()

    def lines(self) -> Iterator[bytes]:
        while True:
            line = self._response.readline()
            if not line:
                return
            yield line

    def close(self) -> None:
        self._response.close()
        if self._own is not None:
            self._own.close()
            self._own = None


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy URL the environment names for ``scheme://host``, as httpx reads it."""

    def env(name: str) -> str:
        return os.environ.get(name) or os.environ.get(name.upper()) or ""

    for entry in env("no_proxy").split(","):
        entry = entry.strip().lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return None
    return env(f"{scheme}_proxy") or env("all_proxy") or None


def _ascii_connection(address: tuple[str, int], *args: Any) -> socket.socket:
    """``socket.create_connection`` with an ASCII host given as bytes: a ``str`` host is
    encoded by the ``idna`` codec, whose import (with ``stringprep`` and ``unicodedata``) is
    a few ms of every command's start; another host is taken as it is."""
    host: str | bytes = address[0]
    with contextlib.suppress(UnicodeEncodeError):
        host = address[0].encode("ascii")
    return socket.create_connection((host, address[1]), *args)  # type: ignore[arg-type]


def tls_context() -> Any:
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class HttpTransport:
    """Requests to the API at ``base_url`` (``http[s]://host[:port][/prefix]``)."""

    def __init__(self, base_url: str, timeout: float) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        self.proxy = _proxy_for(url.scheme, self.host)
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self, timeout: float | None) -> tuple[http.client.HTTPConnection, str]:
        """A new connection, and the form of request target it takes ("" or the origin)."""
        proxy = urlsplit(self.proxy) if self.proxy else None
        host, port = (proxy.hostname or "", proxy.port or 80) if proxy else (self.host, self.port)
        origin = ""
        conn: http.client.HTTPConnection
        if self.tls:
            conn = http.client.HTTPSConnection(
                host, port, timeout=CONNECT_TIMEOUT, context=tls_context()
            )
            if proxy:
                conn.set_tunnel(self.host, self.port, headers=self._proxy_auth(proxy))
        else:
            conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)
            if proxy:
                origin = f"http://{self.host}:{self.port}"
        setattr(conn, "_create_connection", _ascii_connection)  # noqa: B010 (not in the stubs)
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, origin

    @staticmethod
    def _proxy_auth(proxy: Any) -> dict[str, str]:
        if not proxy.username:
            return {}
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
        return {"Proxy-Authorization": "Basic " + base64.b64encode(pair).decode()}

    def send(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        timeout: float | None,
        stream: bool = False,
    ) -> Answer:
        """Send the request; its answer. A call goes on the kept-alive connection (sent once
        more on a new one when the server had closed it); a stream on one of its own."""
        if stream:
            conn, origin = self._connect(timeout)
            try:
                return Response(self._exchange(conn, origin, method, target, headers, body), conn)
            except BaseException:
                conn.close()
                raise
        reused = self._conn is not None
        for attempt in (0, 1):
            if self._conn is None:
                self._conn, self._origin = self._connect(self.timeout)
            try:
                response = self._exchange(self._conn, self._origin, method, target, headers, body)
                return Response(response, None)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        origin: str,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
    ) -> http.client.HTTPResponse:
        if self.proxy and not self.tls:
            headers = {**headers, **self._proxy_auth(urlsplit(self.proxy))}
        conn.request(method, f"{origin}{self.prefix}{target}", body=body, headers=headers)
        return conn.getresponse()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    _origin = ""
