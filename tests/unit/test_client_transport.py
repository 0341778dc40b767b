"""The client's transport on ``http.client`` against a local server: a kept-alive connection
the server closed is asked again on a new one, a proxy of the environment is used as httpx
used it (an absolute target for http, ``NO_PROXY`` respected), a stream is read line by
line as it arrives, and a refused connection is one line naming the API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stackflow.client import ApiUnavailable, StackflowClient
from stackflow.client.transport import PROXY_ENV, _proxy_for
from stackflow.client.types import Stack

STACK = Stack("p", "w")
PAGE = {"runs": [], "next_page_token": None}


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.targets: list[str] = []
        self.connections = 0
        """Connections accepted (a handler is made per connection)."""
        self.close_after_answer = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        # counted here, once per connection: not by id() of the socket, which a closed
        # connection's successor may get again (the cause of 1 failure in about 6 runs)
        self.server.connections += 1
        super().setup()

    def do_GET(self) -> None:
        self.server.targets.append(self.path)
        data = json.dumps(PAGE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        # closed without saying so: the client finds out on its next request
        self.close_connection = self.server.close_after_answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    for base in (*PROXY_ENV, "no_proxy"):
        monkeypatch.delenv(base, raising=False)
        monkeypatch.delenv(base.upper(), raising=False)
    srv = Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_calls_keep_the_connection_alive(server: Server) -> None:
    with StackflowClient(server.url, "t") as api:
        for _ in range(3):
            assert api.list_runs(STACK).runs == []
    assert server.connections == 1
    assert server.targets == ["/v1/stacks/p/w/runs?page_size=20"] * 3


def test_a_connection_the_server_closed_is_asked_again_on_a_new_one(server: Server) -> None:
    server.close_after_answer = True
    with StackflowClient(server.url + "/prefix/", "t") as api:
        assert api.list_runs(STACK).runs == []
        assert api.list_runs(STACK).runs == []
    assert server.targets == ["/prefix/v1/stacks/p/w/runs?page_size=20"] * 2
    assert server.connections == 2


def test_an_http_proxy_gets_the_absolute_target(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", server.url)  # the server plays the proxy
    with StackflowClient("http://api.example:8080", "t") as api:
        api.list_runs(STACK)
    assert server.targets == ["http://api.example:8080/v1/stacks/p/w/runs?page_size=20"]


def test_no_proxy_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    assert _proxy_for("https", "api.example.com") == "http://proxy:3128"
    assert _proxy_for("https", "api.internal") is None
    assert _proxy_for("https", "localhost") is None
    assert _proxy_for("http", "api.example.com") is None


def test_a_refused_connection_is_one_line(server: Server) -> None:
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with (
        StackflowClient(f"http://127.0.0.1:{port}", "t") as api,
        pytest.raises(
            ApiUnavailable, match=rf"stackflow API at http://127.0.0.1:{port} unreachable"
        ),
    ):
        api.list_runs(STACK)


def test_a_url_that_is_not_http_is_refused_with_its_name() -> None:
    from stackflow.client import ApiInvalid

    env = {"STACKFLOW_API_URL": "ftp://x", "STACKFLOW_API_TOKEN": "t"}
    with pytest.raises(ApiInvalid, match="STACKFLOW_API_URL: not an http"):
        StackflowClient.from_env(env)
