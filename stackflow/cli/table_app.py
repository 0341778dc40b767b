"""The typer commands of :data:`stackflow.cli.table.COMMANDS`, made from the table: each
command's parameters are its options' (:func:`stackflow.cli.options.option`), and its body
calls the same function `stackflow` calls when it parses the command line itself."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

from stackflow.cli import table
from stackflow.cli.app import app
from stackflow.cli.options import option, python_type


def runner(cmd: table.Cmd) -> Callable[[dict[str, Any]], None]:
    """The function that runs ``cmd`` (``module:function`` of the table), imported."""
    module, _, name = cmd.run.partition(":")
    function: Callable[[dict[str, Any]], None] = getattr(importlib.import_module(module), name)
    return function


def typer_command(cmd: table.Cmd) -> Callable[..., None]:
    """A function typer reads as ``cmd``: a keyword parameter per option."""

    def command(**values: Any) -> None:
        plain = {
            key: (
                value.value
                if isinstance(value, Enum)
                else ([] if value is None and key in lists else value)
            )
            for key, value in values.items()
        }
        runner(cmd)(plain)

    lists = {o.dest for o in cmd.options if o.kind is list}
    params = [
        inspect.Parameter(
            opt.dest,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if opt.default is table.REQUIRED else opt.default,
            annotation=Annotated[python_type(opt), option(opt)],
        )
        for opt in cmd.options
    ]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = cmd.name.replace("-", "_")
    command.__doc__ = cmd.help
    return command


for _cmd in table.COMMANDS:
    app.command(_cmd.name)(typer_command(_cmd))
