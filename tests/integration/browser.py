"""A real headless Chromium (Debian's package) driven over the DevTools protocol, for tests of
what the Temporal Web UI shows. No test-only browser download: /usr/bin/chromium."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket  # websocket-client, already a dependency of the kubernetes client

FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-allow-origins=*",
    "--window-size=1400,1000",
]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, binary: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.profile = tempfile.mkdtemp(prefix="stackflow-chromium-")
        self.proc = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--remote-debugging-port={self.port}",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.ws = websocket.create_connection(self._page_socket(), timeout=30)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        """DevTools events received so far (those of the domains enabled, e.g. Network)."""

    def _page_socket(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list") as r:
                    pages = [p for p in json.load(r) if p.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools endpoint")
            time.sleep(0.2)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result") or {})
            if "method" in message:
                self.events.append(message)

    def block(self, *patterns: str) -> None:
        """Make every request whose URL matches a pattern (``*`` wildcards) fail in the
        network layer, as if nothing listened there; the page's other requests go through."""
        self.call("Network.enable")
        self.call("Network.setBlockedURLs", urls=list(patterns))

    def blocked_requests(self) -> list[str]:
        """URLs of the requests the page made that :meth:`block` stopped."""
        urls = {
            e["params"]["requestId"]: e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        }
        return [
            urls.get(e["params"]["requestId"], "?")
            for e in self.events
            if e["method"] == "Network.loadingFailed" and e["params"].get("blockedReason")
        ]

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's text, with that of its same-origin frames (the UI renders Markdown
        details in one)."""
        script = (
            "[document.body ? document.body.innerText : ''].concat("
            "[...document.querySelectorAll('iframe')].map(f => {"
            "try { return f.contentDocument.body.innerText } catch (e) { return '' } }))"
            ".join('\\n')"
        )
        result = self.call("Runtime.evaluate", expression=script)
        return str(result.get("result", {}).get("value") or "")

    def wait_for_text(self, *needles: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        raise AssertionError(f"page never showed {needles!r}; it shows:\n{text[:3000]}")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)
