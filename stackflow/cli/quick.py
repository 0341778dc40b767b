"""Answers `stackflow` gives without its typer app, so they start as fast as Python does:
the top-level help (from the static table of :mod:`stackflow.cli.commands`), and
`stackflow status` in API mode (``STACKFLOW_API_URL``), which reads the run through the
HTTP API with the standard library and prints it as the status command does.

Only the plain case is answered here: :func:`answer` returns None for anything else
(another option, an unusual value, a proxy, an answer of the API that is not a success, a
body that is not what it should be, …) and the typer app then runs the command as always,
with its own messages and exit codes. Nothing is printed before that decision, and what is
asked of the API before it is only read (GET), so asking again is harmless.

Imports nothing beyond the standard library until it prints (rich for the table)."""

from __future__ import annotations

import os
import sys

from stackflow.cli.commands import render_help

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported at run time: ``typing`` alone costs a third of a fast answer
    from collections.abc import Mapping
    from typing import Any

URL_ENV = "STACKFLOW_API_URL"
TOKEN_ENV = "STACKFLOW_API_TOKEN"
PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
"""Set (any case), httpx would go through a proxy: the typer app's client does that."""
PHASES = (
    "generating",
    "previewing",
    "awaitingApproval",
    "applying",
    "awaitingDecision",
    "destroying",
    "succeeded",
    "failed",
)
"""``stackflow.release.Phase``'s values (a unit test keeps them equal)."""
STATUS_OPTIONS = {
    "-p": "project",
    "--project": "project",
    "-w": "workspace",
    "--workspace": "workspace",
    "-o": "output",
    "--output": "output",
    "--unavailable-timeout": "timeout",
}
CONNECT_TIMEOUT = 10.0
TIMEOUT = 60.0
"""As :mod:`stackflow.client.http`'s."""
MAX_BODY = 16 * 1024 * 1024
RUN_FIELDS = ("run_id", "workflow_id", "operation", "status")
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def answer(argv: list[str]) -> int | None:
    """The exit code once the invocation ``argv`` is answered; None: run the typer app."""
    if not argv or argv == ["--help"]:
        sys.stdout.write(render_help())
        return 0 if argv else 2  # no arguments: the help, as a usage error (typer's exit 2)
    if argv[0] == "status" and os.environ.get(URL_ENV, "").strip():
        return status(argv[1:])
    return None


# ---- status ----------------------------------------------------------------------------------
def _plain(value: str) -> bool:
    """A project, workspace or run id that goes into a URL path as it is."""
    return (
        value.isascii()
        and value.replace("-", "").replace("_", "").replace(".", "").isalnum()
        and value[0].isalnum()
    )


def _status_options(args: list[str]) -> dict[str, str] | None:
    """``--project``, ``--workspace``, ``--output`` and ``--unavailable-timeout`` given as
    ``-p X``, ``--project X`` or ``--project=X``, each at most once, with plain values;
    None for anything else."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        option, eq, value = args[i].partition("=")
        if eq and option.startswith("--"):
            i += 1
        elif i + 1 < len(args):
            option, value = args[i], args[i + 1]
            i += 2
        else:
            return None
        field = STATUS_OPTIONS.get(option)
        if field is None or field in values or not value or value.startswith("-"):
            return None
        values[field] = value
    values.setdefault("workspace", "default")
    if not _plain(values.get("project", "")) or not _plain(values["workspace"]):
        return None
    if values.setdefault("output", "table") not in ("table", "json"):
        return None
    timeout = values.get("timeout", "0")
    if not timeout.replace(".", "", 1).isdigit() or not timeout.isascii():
        return None
    return values


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(value: Any, kind: type) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _runs(page: Any) -> list[dict[str, Any]] | None:
    """The runs of a ``GET …/runs`` page, if every one has the fields the status uses."""
    if not isinstance(page, dict) or not isinstance(page.get("runs"), list):
        return None
    runs: list[dict[str, Any]] = page["runs"]
    for run in runs:
        if not isinstance(run, dict) or not all(
            isinstance(run.get(key), str) for key in RUN_FIELDS
        ):
            return None
    return runs


def _status_data(view: Any) -> dict[str, Any] | None:
    """``StatusView(...).model_dump(mode="json")`` of a ``GET …/runs/{id}`` answer (as
    ``remote.status`` builds it), if the answer has the fields' types exactly."""
    if not isinstance(view, dict) or not isinstance(view.get("workflow_id"), str):
        return None
    phase, eta = view.get("phase"), view.get("eta_seconds", None)
    running, summary = view.get("running", []), view.get("summary", {})
    if (
        not (phase is None or phase in PHASES)
        or not _optional(view.get("revision"), int)
        or not all(_int(view.get(key, 0)) for key in ("total", "done", "failed"))
        or not (isinstance(running, list) and all(isinstance(r, str) for r in running))
        or not isinstance(summary, dict)
        or not _optional(view.get("error"), str)
        or not (eta is None or _int(eta) or isinstance(eta, float))
        or (isinstance(eta, float) and not abs(eta) < float("inf"))
    ):
        return None
    return {
        "phase": phase,
        "revision": view.get("revision"),
        "total": view.get("total", 0),
        "done": view.get("done", 0),
        "failed": view.get("failed", 0),
        "running": running,
        "changes": {"summary": summary} if summary else {},
        "error": view.get("error"),
        "eta_seconds": None if eta is None else float(eta),
    }


def status(args: list[str]) -> int | None:
    """`stackflow status` through the API: the stack's running operation, as
    ``remote.status`` finds it (the newest page of the stack's runs, then the run)."""
    options = _status_options(args)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if options is None or not token or any(os.environ.get(n) for n in _proxy_names()):
        return None
    project, workspace = options["project"], options["workspace"]
    stack, wid = f"{project}/{workspace}", f"stackflow/{project}/{workspace}"
    try:
        api = Http(os.environ[URL_ENV].strip(), token)
    except ValueError:
        return None
    with api:
        path = f"/v1/stacks/{project}/{workspace}/runs"
        runs = _runs(api.get(path + "?page_size=20"))
        if runs is None:
            return None
        ours = [r for r in runs if r["workflow_id"] == wid]
        if not ours:
            return _fail("not found", f"stack {stack} has no operation (workflow {wid})")
        latest = next((r for r in ours if r["status"] == "running"), ours[0])
        if latest["status"] != "running":
            return _fail(
                "not found",
                f"stack {stack} has no running operation (its last run is {latest['status']}; "
                f"see `stackflow release list -p {project} -w {workspace}`)",
            )
        if not _plain(latest["run_id"]):
            return None
        view = api.get(f"{path}/{latest['run_id']}")
    data = _status_data(view)
    if data is None or not isinstance(view, dict):
        return None
    if data["phase"] is None:
        return _fail(
            "failed", view.get("error") or f"the run of {stack} did not answer the status query"
        )
    print_status(data, ui_link(namespace(), view["workflow_id"], None), options["output"])
    return 0


def _proxy_names() -> list[str]:
    return [name for base in PROXY_ENV for name in (base, base.upper())]


def _fail(kind: str, message: str) -> int:
    """One red line on stderr, as the typer app prints a NotFoundError or OperationFailed."""
    from stackflow.cli.output import error_line
    from stackflow.errors import NotFoundError, OperationFailed, StackflowError

    err: StackflowError = (
        NotFoundError(message) if kind == "not found" else OperationFailed(message)
    )
    error_line(str(err))
    return err.exit_code


def namespace() -> str:
    """The Temporal namespace the UI links name (``temporal_client.settings``'s)."""
    return os.environ.get("TEMPORAL_NAMESPACE", "default")


def ui_link(namespace: str, workflow_id: str, run_id: str | None) -> str:
    """The run's page in the Temporal UI (``STACKFLOW_TEMPORAL_UI``)."""
    base = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233").rstrip("/")
    wid = quote(workflow_id)
    return f"{base}/namespaces/{namespace}/workflows/{wid}" + (f"/{run_id}" if run_id else "")


def quote(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``: every byte of its UTF-8 but letters, digits
    and ``_.-~`` percent-encoded (without importing urllib)."""
    return "".join(c if c in UNRESERVED else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def print_status(data: Mapping[str, Any], link: str, output: str) -> None:
    """What `stackflow status` prints for a run's status view (``StatusView``'s JSON):
    the view and its UI link as JSON, or a table."""
    if output == "json":
        import json

        sys.stdout.write(json.dumps({**data, "ui": link}, indent=2, sort_keys=True) + "\n")
        return
    rows = [
        ("phase", str(data["phase"])),
        ("release", str(data["revision"]) if data["revision"] is not None else "-"),
        ("done", f"{data['done']}/{data['total']}, {data['failed']} failed"),
    ]
    if data["running"]:
        rows.append(("running", ", ".join(data["running"][:5])))
    if data["error"]:
        rows.append(("error", str(data["error"])))
    rows.append(("ui", link))
    text = plain_table(rows, console_width(sys.stdout))
    if text is not None:
        sys.stdout.write(text)
        return
    from rich.table import Table

    from stackflow.cli.output import stdout_console

    table = Table(show_header=False)
    for row in rows:
        table.add_row(*row)
    stdout_console().print(table)


def console_width(stream: Any) -> int | None:
    """The width rich gives a console on ``stream`` (``COLUMNS``, else the terminal's of
    stdin, stdout or stderr, else 80); None where rich may decide otherwise (a dumb
    terminal, Windows, an encoding other than UTF-8)."""
    term = os.environ.get("TERM", "").lower()
    encoding = (getattr(stream, "encoding", "utf-8") or "utf-8").lower()
    if term in ("dumb", "unknown") or sys.platform == "win32" or not encoding.startswith("utf"):
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def plain_table(rows: list[tuple[str, str]], width: int | None) -> str | None:
    """``rich.table.Table(show_header=False)`` of two columns with ``rows``, as a console of
    ``width`` prints it, for the plain case: printable ASCII without markup, where a value
    too long for its column is one word (rich cuts it with an ellipsis) and the first
    column keeps its width. None otherwise (rich lays it out: wraps, markup, wide
    characters, …). tests/unit/test_cli_startup.py compares it with rich's output."""
    if width is None or width < 20:
        return None
    cells = [cell for row in rows for cell in row]
    if not all(c and c.isascii() and c.isprintable() and "[" not in c for c in cells):
        return None
    first = max(len(label) for label, _ in rows) + 2  # with the cell padding
    second = max(len(value) for _, value in rows) + 2
    room = width - 3  # the three borders
    if first + second > room:
        if 2 * first > room:
            return None
        second = room - first
    inner = second - 2
    out = ["┌" + "─" * first + "┬" + "─" * second + "┐"]
    for label, value in rows:
        if len(value) > inner:
            if " " in value:
                return None  # rich wraps it over lines
            value = value[: inner - 1] + "…"
        out.append(f"│ {label.ljust(first - 2)} │ {value.ljust(inner)} │")
    out.append("└" + "─" * first + "┴" + "─" * second + "┘")
    return "\n".join(out) + "\n"


# ---- HTTP ------------------------------------------------------------------------------------
class Http:
    """GET requests with a JSON answer to one API over one kept-alive connection (HTTP/1.1,
    TLS verified as httpx verifies it), for the plain case: any answer but a 200 with a
    Content-Length and a JSON body, and any transport error, is None."""

    def __init__(self, url: str, token: str) -> None:
        scheme, sep, rest = url.partition("://")
        host_port, slash, prefix = rest.partition("/")
        host, colon, port = host_port.partition(":")
        if (
            not sep
            or scheme not in ("http", "https")
            or any(c in url for c in "?#@[] \\")
            or not host
            or (colon and not port.isdigit())
            or not (token.isascii() and token.isprintable())
        ):
            raise ValueError(url)
        self.tls = scheme == "https"
        self.host = host
        self.port = int(port) if colon else (443 if self.tls else 80)
        self.host_header = host_port
        self.prefix = ("/" + prefix).rstrip("/") if slash else ""
        self.token = token
        self.sock: Any = None

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _connect(self) -> Any:
        import socket

        sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT)
        if self.tls:
            sock = self._tls_context().wrap_socket(sock, server_hostname=self.host)
        sock.settimeout(TIMEOUT)
        return sock

    @staticmethod
    def _tls_context() -> Any:
        import ssl

        if os.environ.get("SSL_CERT_FILE"):
            return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        if os.environ.get("SSL_CERT_DIR"):
            return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
        import certifi

        return ssl.create_default_context(cafile=certifi.where())

    def get(self, path: str) -> Any:
        """The JSON of ``GET path`` (under the URL's own path), or None."""
        request = (
            f"GET {self.prefix}{path} HTTP/1.1\r\n"
            f"Host: {self.host_header}\r\n"
            "Accept: */*\r\n"
            "Connection: keep-alive\r\n"
            "User-Agent: stackflow-client/1\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n"
        ).encode()
        try:
            if self.sock is None:
                self.sock = self._connect()
            self.sock.sendall(request)
            return self._response()
        except (OSError, ValueError):
            self.close()
            return None

    def _response(self) -> Any:
        import json

        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk or len(data) > 65536:
                raise ValueError("no complete header")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "")
        if (
            len(parts) < 2
            or parts[0] not in ("HTTP/1.1", "HTTP/1.0")
            or parts[1] != "200"
            or not length.isdigit()
            or int(length) > MAX_BODY
            or "transfer-encoding" in headers
            or headers.get("content-encoding", "identity") != "identity"
        ):
            raise ValueError("not a plain 200")
        size = int(length)
        while len(body) < size:
            chunk = self.sock.recv(min(size - len(body), 1 << 20))
            if not chunk:
                raise ValueError("body cut short")
            body += chunk
        if len(body) != size:
            raise ValueError("more than the body")
        if parts[0] == "HTTP/1.0" or headers.get("connection", "").lower() == "close":
            self.close()
        return json.loads(body)
