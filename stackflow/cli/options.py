"""The options the `stackflow` commands share, declared once (one name, one help text)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from stackflow.cli.output import OutputFormat


class OnFailure(StrEnum):
    fail = "fail"
    pause = "pause"


ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project of the stack.")]
WorkspaceOpt = Annotated[str, typer.Option("--workspace", "-w", help="Workspace of the stack.")]
FileOpt = Annotated[str, typer.Option("--file", "-f", help="Spec file (YAML/JSON); '-' = stdin.")]
OutputOpt = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", help="table (for people) or json (stable, for scripts)."),
]


class RunOutput(StrEnum):
    table = "table"
    json = "json"
    ndjson = "ndjson"


RunOutputOpt = Annotated[
    RunOutput,
    typer.Option(
        "--output",
        "-o",
        help="table (for people), json (the result, for scripts) or ndjson (the run's event "
        "stream as it happens, header first; as `stackflow events`).",
    ),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help="A directory of Rego modules (package stackflow) this run evaluates besides its "
        "project's bundle (stackflow policy push); deny fails the run (exit 2).",
    ),
]
YesOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Approve without asking (through the API: needs the approver role). On a "
        "four-eyes project the run still waits for another approver; the command says so "
        "and follows it.",
    ),
]
ConcurrencyOpt = Annotated[int, typer.Option("--max-concurrency", help="Resources in flight.")]
IgnoreOpt = Annotated[
    list[str] | None, typer.Option("--ignore-field", help="Dotted path never diffed (repeat).")
]
WatchOpt = Annotated[bool, typer.Option("--watch", help="Wait until each resource is ready.")]
FailFastOpt = Annotated[bool, typer.Option("--fail-fast", help="Stop starting nodes on failure.")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Take over fields another manager owns (Kubernetes).")
]
AdoptOpt = Annotated[
    bool, typer.Option("--adopt", help="Adopt existing objects that no stack owns yet.")
]
DetailOpt = Annotated[bool, typer.Option("--detail/--no-detail", help="Show per-field diffs.")]
OnFailureOpt = Annotated[
    OnFailure,
    typer.Option(
        "--on-failure",
        help="fail: end the run when nodes fail; pause: wait for `stackflow retry` or `abort`.",
    ),
]
TargetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        help="Only resources whose id matches this glob, and what they depend on (repeat).",
    ),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        help="Leave out resources whose id matches this glob, and what depends on them "
        "(repeat); their state is kept as recorded.",
    ),
]
UnavailableOpt = Annotated[
    float,
    typer.Option(
        "--unavailable-timeout",
        help="Seconds unreachable infrastructure is retried before its node fails; also how "
        "long the CLI waits out an unreachable Temporal before it gives up following.",
    ),
]


WaitOpt = Annotated[
    float,
    typer.Option(
        "--unavailable-timeout",
        min=0,
        help="Seconds the CLI waits out an unreachable Temporal before it gives up.",
    ),
]
