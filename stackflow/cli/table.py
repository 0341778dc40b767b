"""The options of the `stackflow` commands, declared once: each :class:`Opt` (its flags, the
name the command's code reads, its type, default and help) and, for the commands that go
through the HTTP API without the typer app, each :class:`Cmd` (its options and the function
that runs it). :mod:`stackflow.cli.options` makes the typer options of the same table and
:mod:`stackflow.cli.table_app` the typer commands; :func:`parse` reads a command line with
the same table, for `stackflow` to run the command without typer (:mod:`stackflow.cli.main`).

:func:`parse` takes what the typer command takes in its ordinary spelling; anything else
(``--help``, a value typer would refuse, ``-pX``, …) is None: the typer app then parses it
and says what is wrong, with its own message and exit code. Standard library only."""

from __future__ import annotations

from typing import Any

RUN_OUTPUTS = ("table", "json", "ndjson")
OUTPUTS = ("table", "json")
ON_FAILURE = ("fail", "pause")


class Opt:
    """One option: ``flags`` (``--name`` first), ``dest`` (the parameter's name), ``kind``
    (str, int, float, bool, list or a tuple of choices), ``default`` (``REQUIRED``: none),
    ``help``; ``off`` names the flag that sets a bool False (``--no-detail``); ``minimum``
    the smallest number typer takes."""

    __slots__ = ("default", "dest", "flags", "help", "kind", "minimum", "off")

    def __init__(
        self,
        flags: tuple[str, ...],
        dest: str,
        kind: Any,
        help: str,
        default: Any = None,
        off: str | None = None,
        minimum: float | None = None,
    ) -> None:
        self.flags, self.dest, self.kind, self.help = flags, dest, kind, help
        self.default, self.off, self.minimum = default, off, minimum

    def but(self, default: Any) -> Opt:
        """The same option with another default (a command's own)."""
        return Opt(self.flags, self.dest, self.kind, self.help, default, self.off, self.minimum)


REQUIRED = ...
"""The default of an option a command cannot do without."""

PROJECT = Opt(("--project", "-p"), "project", str, "Project of the stack.", REQUIRED)
WORKSPACE = Opt(("--workspace", "-w"), "workspace", str, "Workspace of the stack.", "default")
FILE = Opt(("--file", "-f"), "file", str, "Spec file (YAML/JSON); '-' = stdin.", REQUIRED)
OUTPUT = Opt(
    ("--output", "-o"),
    "output",
    OUTPUTS,
    "table (for people) or json (stable, for scripts).",
    "table",
)
RUN_OUTPUT = Opt(
    ("--output", "-o"),
    "output",
    RUN_OUTPUTS,
    "table (for people), json (the result, for scripts) or ndjson (the run's event "
    "stream as it happens, header first; as `stackflow events`).",
    "table",
)
POLICY = Opt(
    ("--policy",),
    "policy",
    str,
    "A directory of Rego modules (package stackflow) this run evaluates besides its "
    "project's bundle (stackflow policy push); deny fails the run (exit 2).",
)
YES = Opt(
    ("--yes", "-y"),
    "yes",
    bool,
    "Approve without asking (through the API: needs the approver role). On a "
    "four-eyes project the run still waits for another approver; the command says so "
    "and follows it.",
    False,
)
CONCURRENCY = Opt(("--max-concurrency",), "max_concurrency", int, "Resources in flight.", 16)
"""Its default is the runs' own (``temporal.operation.MAX_CONCURRENCY_DEFAULT``; this module
imports nothing of stackflow, for the CLI's start-up)."""
IGNORE = Opt(("--ignore-field",), "ignore_field", list, "Dotted path never diffed (repeat).")
WATCH = Opt(("--watch",), "watch", bool, "Wait until each resource is ready.", False)
FAIL_FAST = Opt(("--fail-fast",), "fail_fast", bool, "Stop starting nodes on failure.", False)
FORCE = Opt(
    ("--force",), "force", bool, "Take over fields another manager owns (Kubernetes).", False
)
ADOPT = Opt(("--adopt",), "adopt", bool, "Adopt existing objects that no stack owns yet.", False)
DETAIL = Opt(("--detail",), "detail", bool, "Show per-field diffs.", False, off="--no-detail")
ON_FAILURE_OPT = Opt(
    ("--on-failure",),
    "on_failure",
    ON_FAILURE,
    "fail: end the run when nodes fail; pause: wait for `stackflow retry` or `abort`.",
    "fail",
)
TARGET = Opt(
    ("--target",),
    "target",
    list,
    "Only resources whose id matches this glob, and what they depend on (repeat).",
)
EXCLUDE = Opt(
    ("--exclude",),
    "exclude",
    list,
    "Leave out resources whose id matches this glob, and what depends on them "
    "(repeat); their state is kept as recorded.",
)
UNAVAILABLE = Opt(
    ("--unavailable-timeout",),
    "unavailable_timeout",
    float,
    "Seconds unreachable infrastructure is retried before its node fails; also how "
    "long the CLI waits out an unreachable Temporal before it gives up following.",
    600.0,
)
WAIT = Opt(
    ("--unavailable-timeout",),
    "unavailable_timeout",
    float,
    "Seconds the CLI waits out an unreachable Temporal before it gives up.",
    600.0,
    minimum=0,
)
FULL = Opt(
    ("--full",),
    "full",
    bool,
    "Every field and whole values, from the state backend (STACKFLOW_STATE_URL); "
    "by default long values are shortened and big diffs summarised.",
    False,
)
TO = Opt(("--to",), "to", int, "The release whose spec to apply again.", REQUIRED)
REASON = Opt(("--reason",), "reason", str, "Recorded with the decision.")
RUN = Opt(("--run",), "run", str, "Run id (default: the stack's newest run).")
FOLLOW = Opt(("--follow",), "follow", bool, "Wait for new events until the run completes.", False)
AFTER = Opt(("--after",), "after", int, "Only events after this seq.", 0, minimum=0)
EVENTS_OUTPUT = Opt(
    ("--output", "-o"),
    "output",
    RUN_OUTPUTS,
    "table (a line per event), ndjson (the stream's lines, header first) or json.",
    "table",
)


class Cmd:
    """A command of the table: its name, help (first line: the one of `stackflow --help`),
    options in the order `--help` lists them, and ``run``: ``module:function`` taking the
    options' values by ``dest``."""

    __slots__ = ("help", "name", "options", "run")

    def __init__(self, name: str, run: str, help: str, *options: Opt) -> None:
        self.name, self.run, self.help, self.options = name, run, help, options


VERBS = "stackflow.cli.verbs"
STEER = (WORKSPACE, REASON, WAIT)
COMMANDS = (
    Cmd(
        "preview",
        f"{VERBS}:preview",
        "Show what apply would change: desired vs live vs prior (three-way diff).",
        FILE,
        PROJECT,
        WORKSPACE,
        RUN_OUTPUT,
        IGNORE,
        FORCE,
        ADOPT,
        DETAIL.but(True),
        UNAVAILABLE,
        TARGET,
        EXCLUDE,
        FULL,
        POLICY,
    ),
    Cmd(
        "apply",
        f"{VERBS}:apply",
        "Preview, ask, then apply the spec as a durable Temporal workflow.",
        FILE,
        PROJECT,
        WORKSPACE,
        YES,
        RUN_OUTPUT,
        CONCURRENCY,
        IGNORE,
        WATCH,
        FAIL_FAST,
        FORCE,
        ADOPT,
        DETAIL,
        ON_FAILURE_OPT,
        UNAVAILABLE,
        TARGET,
        EXCLUDE,
        POLICY,
    ),
    Cmd(
        "destroy",
        f"{VERBS}:destroy",
        "Delete everything the stack's last release holds, dependents first.",
        PROJECT,
        WORKSPACE,
        YES,
        RUN_OUTPUT,
        CONCURRENCY,
        FAIL_FAST,
        ON_FAILURE_OPT,
        UNAVAILABLE,
        TARGET,
        EXCLUDE,
        POLICY,
    ),
    Cmd(
        "rollback",
        f"{VERBS}:rollback",
        "Apply release N's spec again as a new release (operation rollback): preview, ask,\n"
        "apply, exactly as apply.",
        PROJECT,
        TO,
        WORKSPACE,
        YES,
        RUN_OUTPUT,
        CONCURRENCY,
        DETAIL,
        FAIL_FAST,
        ON_FAILURE_OPT,
        UNAVAILABLE,
    ),
    Cmd(
        "refresh",
        f"{VERBS}:refresh",
        "Read every recorded resource and record its live state as a new release, changing\n"
        "nothing (`tofu apply -refresh-only`): shows what it would record, asks (or --yes).",
        PROJECT,
        WORKSPACE,
        YES,
        RUN_OUTPUT,
        DETAIL.but(True),
        UNAVAILABLE,
        TARGET,
        EXCLUDE,
    ),
    Cmd(
        "approve",
        f"{VERBS}:approve",
        "Approve the stack's operation waiting in awaitingApproval.",
        PROJECT,
        *STEER,
    ),
    Cmd(
        "reject",
        f"{VERBS}:reject",
        "Reject the stack's operation waiting in awaitingApproval (it ends failed).",
        PROJECT,
        *STEER,
    ),
    Cmd(
        "retry",
        f"{VERBS}:retry",
        "Re-run the failed nodes (and those skipped because of them) of a paused run.",
        PROJECT,
        *STEER,
    ),
    Cmd("abort", f"{VERBS}:abort", "End a paused run as failed, as it is.", PROJECT, *STEER),
    Cmd(
        "cancel",
        f"{VERBS}:cancel",
        "Cancel the stack's running operation; its release ends failed, saying so.",
        PROJECT,
        WORKSPACE,
        WAIT,
    ),
    Cmd(
        "events",
        f"{VERBS}:events",
        "A run's events (run_start, phase, planned_change, change_summary, approval_wait,\n"
        "apply_start, apply_complete, apply_errored, run_complete), as the API streams them.",
        PROJECT,
        WORKSPACE,
        RUN,
        FOLLOW,
        AFTER,
        EVENTS_OUTPUT,
        WAIT,
    ),
    Cmd(
        "status",
        f"{VERBS}:status",
        "Phase and progress of the stack's running operation.",
        PROJECT,
        WORKSPACE,
        OUTPUT,
        WAIT,
    ),
)
BY_NAME = {cmd.name: cmd for cmd in COMMANDS}


def defaults(cmd: Cmd) -> dict[str, Any]:
    return {o.dest: ([] if o.kind is list else o.default) for o in cmd.options}


def _value(opt: Opt, text: str) -> Any:
    """The option's value of ``text`` as typer converts it; ValueError where it refuses."""
    if isinstance(opt.kind, tuple):
        if text not in opt.kind:
            raise ValueError(text)
        return text
    if opt.kind is int or opt.kind is float:
        value = opt.kind(text.strip()) if text.strip() == text else opt.kind("x")
        if value != value or (opt.minimum is not None and value < opt.minimum):
            raise ValueError(text)
        return value
    return text


def parse(cmd: Cmd, args: list[str]) -> dict[str, Any] | None:
    """The options of ``cmd`` given in ``args`` (by ``dest``, defaults for the others), as
    typer parses them; None for anything but the ordinary spelling of valid options."""
    flags: dict[str, tuple[Opt, bool]] = {}
    for opt in cmd.options:
        for flag in opt.flags:
            flags[flag] = (opt, True)
        if opt.off:
            flags[opt.off] = (opt, False)
    values = defaults(cmd)
    seen: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, text = arg.partition("=")
        if not name.startswith("--"):
            name, eq, text = arg, "", ""
        found = flags.get(name)
        if found is None:
            return None
        opt, on = found
        i += 1
        if opt.kind is bool:
            if eq:
                return None
            values[opt.dest] = on
            continue
        if not eq:
            if i >= len(args) or (args[i].startswith("-") and args[i] != "-"):
                return None  # a value that looks like an option: typer says what it takes
            text = args[i]
            i += 1
        try:
            value = _value(opt, text)
        except ValueError:
            return None
        if opt.kind is list:
            values[opt.dest].append(value)
        else:
            values[opt.dest] = value
        seen.add(opt.dest)
    if any(v is REQUIRED for v in values.values()):
        return None
    return values
