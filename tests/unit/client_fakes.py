"""A stand-in for the typed client's HTTP transport (``StackflowClient(transport=...)``):
each request goes to a handler, which answers with a :class:`Reply` (or raises the
``OSError`` a dropped connection raises)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit


class Sent:
    """A request as the transport got it."""

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes | None):
        url = urlsplit(target)
        self.method, self.path = method, url.path
        self.params = dict(parse_qsl(url.query))
        self.headers, self.content = headers, body or b""


class Reply:
    """An answer: ``status`` and a JSON body (``json``), raw ``content``, or ``chunks`` (a
    stream, which may raise part-way)."""

    def __init__(
        self,
        status: int,
        *,
        json: Any = None,
        content: bytes = b"",
        chunks: Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        body = content if json is None else _dumps(json)
        self._chunks = chunks if chunks is not None else [body]

    def read(self) -> bytes:
        return b"".join(self._chunks)

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self._chunks:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if pending:
            yield pending

    def close(self) -> None:
        pass


def _dumps(data: Any) -> bytes:
    return json.dumps(data).encode()


class FakeTransport:
    def __init__(self, handler: Callable[[Sent], Reply]) -> None:
        self.handler = handler

    def send(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        timeout: float | None,
        stream: bool = False,
    ) -> Reply:
        return self.handler(Sent(method, target, headers, body))

    def close(self) -> None:
        pass
