"""The `stackflow` command's table of contents: every top-level command and command group,
the module that registers it on the typer app and its one-line help, in the order `--help`
lists them. The app imports a command's module only when that command runs
(:class:`stackflow.cli.app.LazyGroup`), and `stackflow --help` is rendered from this table
alone (:func:`render_help`), without typer or rich. A unit test keeps the table equal to
what the modules register (tests/unit/test_cli_startup.py).

Standard library only: this module is on the path of every `stackflow` invocation."""

from __future__ import annotations

import os
import sys

from stackflow.cli import table

APP_HELP = "stackflow: Kusion-compatible infrastructure operations on Temporal."
EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 operation failed (or infrastructure or Temporal unreachable), "
    "2 bad input, "
    "3 stack locked by a running operation (or an object or path another stack owns), "
    "4 run paused on failed nodes "
    "(stackflow retry / abort), or drift found (drift check)."
)


class Entry:
    """A command or command group: its name, the module that registers it, and the first
    paragraph of its help on one line. (A plain class: the ``typing`` module alone would
    double the import time of this one.)"""

    __slots__ = ("help", "module", "name")

    def __init__(self, name: str, module: str, help: str) -> None:
        self.name = name
        self.module = module
        self.help = help

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, {self.module!r}, {self.help!r})"


def _table(name: str) -> Entry:
    """A command of the option table (:mod:`stackflow.cli.table`), its help the table's."""
    return Entry(name, "stackflow.cli.table_app", " ".join(table.BY_NAME[name].help.split()))


COMMANDS: tuple[Entry, ...] = (
    Entry(
        "validate",
        "stackflow.cli.offline",
        "Check a spec: shape, id conventions, dependencies, references, cycles.",
    ),
    Entry(
        "graph",
        "stackflow.cli.offline",
        "Show the dependency graph: layers in apply order (edges: dependency -> dependent).",
    ),
    Entry(
        "output",
        "stackflow.cli.offline",
        "The recorded attributes of the stack's resources (latest release), or one value of "
        "them, sensitive values masked unless --show-sensitive.",
    ),
    Entry(
        "codec-server",
        "stackflow.cli.state",
        "Serve Temporal's remote codec (/encode, /decode) for the Web UI and the temporal CLI.",
    ),
    _table("preview"),
    _table("apply"),
    _table("destroy"),
    _table("rollback"),
    _table("refresh"),
    Entry(
        "worker",
        "stackflow.cli.worker",
        "Run a worker (as `python -m stackflow.worker`): TEMPORAL_ADDRESS, STACKFLOW_TASK_QUEUE, …",
    ),
    _table("approve"),
    _table("reject"),
    _table("retry"),
    _table("abort"),
    _table("cancel"),
    _table("status"),
    Entry(
        "serve",
        "stackflow.cli.serve",
        "Serve the HTTP API and the approvers' web UI (/ui): runs, releases, outputs (bearer "
        "tokens from the file STACKFLOW_API_TOKENS names; Temporal and the state backend as "
        "the CLI reaches them).",
    ),
    _table("events"),
    Entry(
        "set",
        "stackflow.cli.sets",
        "Many stacks as one run: preview, apply or destroy a set file's stacks in dependency "
        "order, values passed downstream ($stack. references); status of a set's run.",
    ),
    Entry("release", "stackflow.cli.offline", "Inspect, unlock and import releases of a stack."),
    Entry(
        "state",
        "stackflow.cli.state",
        "The state backend (STACKFLOW_STATE_URL): schema migrations and imports.",
    ),
    Entry(
        "keys",
        "stackflow.cli.state",
        "Encryption keys for payloads and state (STACKFLOW_ENCRYPTION_KEY).",
    ),
    Entry(
        "policy",
        "stackflow.cli.policy",
        "Policy-as-code (Rego, package stackflow): push a project's bundle, see the input "
        "document policies read, test a bundle against a spec.",
    ),
    Entry(
        "drift",
        "stackflow.cli.drift",
        "Detect drift: live objects changed behind stackflow's back.",
    ),
    Entry(
        "notifications",
        "stackflow.cli.notifications",
        "Outbound notifications (CloudEvents to the project's webhook destinations).",
    ),
    Entry(
        "source",
        "stackflow.cli.sources",
        "A stack's git source: signed pushes to its branch (POST /v1/hooks/github or "
        "/v1/hooks/generic) start runs of the pushed commit.",
    ),
    Entry(
        "notify",
        "stackflow.cli.notify",
        "A project's notification destinations: webhooks that get each run's transitions as "
        "signed CloudEvents.",
    ),
)
ENTRIES = {entry.name: entry for entry in COMMANDS}
MODULES = tuple(dict.fromkeys(entry.module for entry in COMMANDS))
"""The command modules, in the order their commands are listed."""


# ---- `stackflow --help` -----------------------------------------------------------------------
def _width() -> int:
    """The help's width as rich picks it: COLUMNS, else the terminal's, else 80."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), 40)
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            width = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            continue
        if width > 0:
            return max(width, 40)
    return 80


def _colour(stream: object) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM", "") in ("dumb", "unknown"):
        return bool(os.environ.get("FORCE_COLOR"))
    isatty = getattr(stream, "isatty", None)
    return bool(os.environ.get("FORCE_COLOR")) or bool(isatty and isatty())


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces (a word longer
    than the line is cut)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > width:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not word:
            continue
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line or not lines:
        lines.append(line)
    return lines


def render_help(width: int | None = None, colour: bool | None = None) -> str:
    """The top-level help (what `stackflow --help` prints): usage, the options, every
    command and group of :data:`COMMANDS` with its one-line help, and the exit codes; laid
    out as typer's help of a subcommand is (panels), ANSI styles only on a terminal."""
    width = _width() if width is None else width
    colour = _colour(sys.stdout) if colour is None else colour

    def style(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if colour and text else text

    def panel(title: str, rows: list[tuple[str, str]]) -> list[str]:
        inner = width - 4  # "│ " + content + " │"
        first = max(len(name) for name, _ in rows)
        text_width = max(inner - first - 2, 10)
        top = f"╭─ {title} " + "─" * max(width - len(title) - 5, 0) + "╮"
        out = [style(top[:3], "2") + title + style(top[3 + len(title) :], "2")]
        for name, text in rows:
            for n, piece in enumerate(_wrap(text, text_width)):
                label = name if n == 0 else ""
                cell = style(label.ljust(first), "1;36") if label else " " * first
                pad = " " * max(text_width - len(piece), 0)
                out.append(f"{style('│', '2')} {cell}  {piece}{pad} {style('│', '2')}")
        out.append(style("╰" + "─" * (width - 2) + "╯", "2"))
        return out

    usage = _wrap("Usage: stackflow [OPTIONS] COMMAND [ARGS]...", width - 2)
    usage[0] = usage[0].replace(
        "Usage: stackflow", f"{style('Usage:', '33')} {style('stackflow', '1')}"
    )
    lines = [
        "",
        *(f" {line}" for line in usage),
        "",
        *(f" {line}" for line in _wrap(APP_HELP, width - 2)),
        "",
        *panel("Options", [("--help", "Show this message and exit.")]),
        *panel("Commands", [(entry.name, entry.help) for entry in COMMANDS]),
        "",
        *(f" {line}" for line in _wrap(EXIT_CODES_HELP, width - 2)),
        "",
    ]
    return "\n".join(lines) + "\n"
