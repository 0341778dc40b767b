"""The typer options of the `stackflow` commands, made from the one table of
:mod:`stackflow.cli.table` (one name, one help text)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from stackflow.cli import table
from stackflow.cli.output import OutputFormat


class OnFailure(StrEnum):
    fail = "fail"
    pause = "pause"


class RunOutput(StrEnum):
    table = "table"
    json = "json"
    ndjson = "ndjson"


CHOICES: dict[tuple[str, ...], type[StrEnum]] = {
    table.OUTPUTS: OutputFormat,
    table.RUN_OUTPUTS: RunOutput,
    table.ON_FAILURE: OnFailure,
}
"""The typer type of each choice of the table."""


def python_type(opt: table.Opt) -> Any:
    if isinstance(opt.kind, tuple):
        return CHOICES[opt.kind]
    if opt.kind is list:
        return list[str] | None
    if opt.kind is str and opt.default is None:
        return str | None
    return opt.kind


def option(opt: table.Opt) -> Any:
    """``typer.Option(...)`` of ``opt``."""
    flags = (f"{opt.flags[0]}/{opt.off}",) if opt.off else opt.flags
    extra: dict[str, Any] = {} if opt.minimum is None else {"min": opt.minimum}
    return typer.Option(*flags, help=opt.help, **extra)


ProjectOpt = Annotated[str, option(table.PROJECT)]
WorkspaceOpt = Annotated[str, option(table.WORKSPACE)]
FileOpt = Annotated[str, option(table.FILE)]
OutputOpt = Annotated[OutputFormat, option(table.OUTPUT)]
RunOutputOpt = Annotated[RunOutput, option(table.RUN_OUTPUT)]
PolicyOpt = Annotated[str | None, option(table.POLICY)]
YesOpt = Annotated[bool, option(table.YES)]
ConcurrencyOpt = Annotated[int, option(table.CONCURRENCY)]
IgnoreOpt = Annotated[list[str] | None, option(table.IGNORE)]
WatchOpt = Annotated[bool, option(table.WATCH)]
FailFastOpt = Annotated[bool, option(table.FAIL_FAST)]
ForceOpt = Annotated[bool, option(table.FORCE)]
AdoptOpt = Annotated[bool, option(table.ADOPT)]
DetailOpt = Annotated[bool, option(table.DETAIL)]
OnFailureOpt = Annotated[OnFailure, option(table.ON_FAILURE_OPT)]
TargetOpt = Annotated[list[str] | None, option(table.TARGET)]
ExcludeOpt = Annotated[list[str] | None, option(table.EXCLUDE)]
UnavailableOpt = Annotated[float, option(table.UNAVAILABLE)]
WaitOpt = Annotated[float, option(table.WAIT)]
