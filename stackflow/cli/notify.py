"""``stackflow notify add|list|remove``: a project's notification destinations one at a time
(what ``PUT|GET|DELETE /v1/projects/{project}/notifications/{name}`` do, through the API).
A destination's secret is
read from a file or stdin and never shown. (``stackflow notifications failed`` lists the
deliveries that failed.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stackflow.cli.api_mode import api_client
from stackflow.cli.app import app
from stackflow.cli.binding_input import (
    PLACEHOLDER,
    check_names,
    checked,
    exit_codes,
    read_secret,
)
from stackflow.cli.options import OutputOpt, ProjectOpt
from stackflow.cli.output import OutputFormat, echo_safe, emit, print_json
from stackflow.client.types import NotificationTargetView, to_json
from stackflow.core.errors import SpecError
from stackflow.model.notifications import RESERVED_NAMES, TARGET_NAME, TYPES, Destination

PREFIX = "io.stackflow."
OPTIONS = {"url": "--url", "secret": "the secret", "types": "--type"}
NO_DESTINATION = "the project has no destination of that name"

notify_app = typer.Typer(
    help="A project's notification destinations: webhooks that get each run's transitions "
    "as signed CloudEvents.",
    epilog=exit_codes(NO_DESTINATION, "a bad name, URL, type or secret"),
    no_args_is_help=True,
)
app.add_typer(notify_app, name="notify")

NameOpt = Annotated[
    str, typer.Option("--name", help="The destination's name (letters, digits, '.', '_', '-').")
]


def _check_name(name: str) -> None:
    if not re.fullmatch(TARGET_NAME, name) or len(name) > 100:
        raise SpecError(
            f"--name {name!r}: letters, digits, '.', '_' and '-', at most 100 characters"
        )


def _types(given: list[str]) -> list[str]:
    """The CloudEvent types ``--type`` names (``run.failed`` or ``io.stackflow.run.failed``),
    each once, in order; all of them when none is given."""
    if not given:
        return list(TYPES)
    out: list[str] = []
    for value in given:
        full = value if value.startswith(PREFIX) else PREFIX + value
        if full not in TYPES:
            names = ", ".join(t.removeprefix(PREFIX) for t in TYPES)
            raise SpecError(f"--type: unknown type {value!r}: one of {names}")
        if full not in out:
            out.append(full)
    return out


def _short(types: list[str]) -> str:
    if sorted(types) == sorted(TYPES):
        return "all"
    return ", ".join(t.removeprefix(PREFIX) for t in types)


def _show(project: str, views: list[NotificationTargetView], output: OutputFormat) -> None:
    def data() -> list[dict[str, Any]]:
        return [{"project": project, **to_json(v)} for v in views]

    def table(console: Console) -> None:
        if not views:
            console.print(f"project {project} has no notification destinations", markup=False)
            return
        t = Table("Name", "URL", "Types")
        t.columns[1].overflow = t.columns[2].overflow = "fold"
        for v in views:
            t.add_row(Text(v.name), Text(v.url), _short(v.types))
        console.print(t)

    emit(output, data, table)


@notify_app.command(
    "add",
    help="Add the destination NAME after the project's others, or replace the one of that "
    "name.\n\nEach request it gets is signed X-Stackflow-Signature: sha256=<HMAC-SHA256 of "
    "the body with the secret>; the secret is read from --secret-file or stdin, stored sealed "
    "and never shown. Through the API this needs the approver role.",
    epilog=exit_codes(None, "a bad --name, --url or --type, an empty or short secret"),
)
def add(
    project: ProjectOpt,
    name: NameOpt,
    url: Annotated[str, typer.Option("--url", help="Where the CloudEvents are posted (http(s)).")],
    type_: Annotated[
        list[str] | None,
        typer.Option(
            "--type",
            help="A CloudEvent type it gets, e.g. run.failed or io.stackflow.run.failed "
            "(repeat; default: all).",
        ),
    ] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-file",
            help="File holding the signing secret (16-256 characters; '-' or none: read "
            "from stdin, asked for on a terminal). Never given as an argument.",
            show_default=False,
        ),
    ] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Add or replace a destination of the project (help: the decorator's)."""
    check_names(project=project)
    _check_name(name)
    if name in RESERVED_NAMES:
        raise SpecError(f"--name {name!r} is reserved: choose another name")
    data = {"url": url, "types": _types(type_ or [])}
    checked(Destination, {**data, "secret": PLACEHOLDER}, OPTIONS)  # before asking for it
    destination = checked(Destination, {**data, "secret": read_secret(secret_file)}, OPTIONS)
    with api_client() as api:
        view = api.set_notification(project, name, destination)
    if output is OutputFormat.json:
        print_json({"project": project, **to_json(view)})
    else:
        _show(project, [view], output)


@notify_app.command("list", epilog=exit_codes(None, "a bad name"))
def list_(project: ProjectOpt, output: OutputOpt = OutputFormat.table) -> None:
    """The project's destinations, in order (never their secrets)."""
    check_names(project=project)
    with api_client() as api:
        views = api.notifications(project)
    _show(project, views, output)


@notify_app.command("remove", epilog=exit_codes(NO_DESTINATION, "a bad name"))
def remove(project: ProjectOpt, name: NameOpt, output: OutputOpt = OutputFormat.table) -> None:
    """Remove the project's destination NAME (through the API: an approver's)."""
    check_names(project=project)
    _check_name(name)
    with api_client() as api:
        api.remove_notification(project, name)
    if output is OutputFormat.json:
        print_json({"project": project, "name": name, "removed": True})
    else:
        echo_safe(f"project {project}: notification destination {name} removed")
