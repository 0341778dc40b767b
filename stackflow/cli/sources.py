"""``stackflow source set|show|unset``: a stack's git source (what ``PUT|GET|DELETE
/v1/stacks/{project}/{workspace}/source`` do, through the API). The webhook secret is read
from a file or stdin and never shown."""

from __future__ import annotations

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
from stackflow.cli.options import OutputOpt, ProjectOpt, WorkspaceOpt
from stackflow.cli.output import OutputFormat, echo_safe, emit, print_json
from stackflow.client.types import SourceView, to_json
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef
from stackflow.model.source import GitSource, SourceMode

OPTIONS = {
    "url": "--url",
    "ref": "--ref",
    "path": "--path",
    "on_push": "--on-push",
    "secret": "the secret",
}

source_app = typer.Typer(
    help="A stack's git source: signed pushes to its branch (POST /v1/hooks/github or "
    "/v1/hooks/generic) start runs of the pushed commit.",
    epilog=exit_codes("no git source bound", "a bad URL, path, branch or secret"),
    no_args_is_help=True,
)
app.add_typer(source_app, name="source")

SecretFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        help="File holding the webhook secret (16-256 characters; '-' or none: read from "
        "stdin, asked for on a terminal). Never given as an argument.",
        show_default=False,
    ),
]


UrlOpt = Annotated[
    str, typer.Option("--url", help="The repository's http(s) URL (smart HTTP), no credentials.")
]
RefOpt = Annotated[str, typer.Option("--ref", help="The branch whose pushes start runs.")]
OnPushOpt = Annotated[
    str,
    typer.Option(
        "--on-push", metavar="apply|preview", help="What a push starts: apply or preview."
    ),
]
AutoApproveOpt = Annotated[
    bool, typer.Option("--auto-approve", help="A push's apply is approved up front.")
]


def source_input(
    url: str, path: str, ref: str, on_push: str, auto_approve: bool, secret_file: Path | None
) -> GitSource:
    """The binding the options give, checked before the secret is asked for."""
    if on_push not in {m.value for m in SourceMode}:
        raise SpecError(f"--on-push: apply or preview, not {on_push!r}")
    data = {"url": url, "ref": ref, "path": path, "on_push": on_push, "auto_approve": auto_approve}
    checked(GitSource, {**data, "secret": PLACEHOLDER}, OPTIONS)  # before asking for it
    return checked(GitSource, {**data, "secret": read_secret(secret_file)}, OPTIONS)


def show_view(names: dict[str, str], view: SourceView, output: OutputFormat, file: str) -> None:
    def data() -> dict[str, Any]:
        return {**names, **to_json(view)}

    def table(console: Console) -> None:
        t = Table(show_header=False)
        t.add_column(style="bold")
        t.add_column(overflow="fold")
        for field, value in (
            *names.items(),
            ("repository", view.url),
            ("branch", view.ref),
            (file, view.path),
            ("on push", str(view.on_push)),
            ("auto-approve", "yes" if view.auto_approve else "no"),
        ):
            t.add_row(field, Text(value))
        console.print(t)

    emit(output, data, table)


def _stack_view(stack: StackRef, view: SourceView, output: OutputFormat) -> None:
    show_view({"project": stack.project, "workspace": stack.workspace}, view, output, "spec file")


BAD_SOURCE = "a bad --url, --path, --ref or --on-push, an empty or short secret, a bad name"
NO_SOURCE = "the stack has no git source"


@source_app.command(
    "set",
    help="Bind the stack to a spec file in a git repository (replacing its binding).\n\n"
    "The webhook secret (what GitHub or a CI system signs pushes with) is read from "
    "--secret-file or stdin, stored sealed and never shown. Through the API this needs the "
    "approver role.",
    epilog=exit_codes(None, BAD_SOURCE),
)
def set_source(
    project: ProjectOpt,
    url: UrlOpt,
    path: Annotated[str, typer.Option("--path", help="The spec file's path in the repository.")],
    workspace: WorkspaceOpt = "default",
    ref: RefOpt = "main",
    on_push: OnPushOpt = SourceMode.apply.value,
    auto_approve: AutoApproveOpt = False,
    secret_file: SecretFileOpt = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Bind the stack to a spec file in a git repository (help: the decorator's)."""
    check_names(project=project, workspace=workspace)
    stack = StackRef(project, workspace)
    source = source_input(url, path, ref, on_push, auto_approve, secret_file)
    with api_client() as api:
        view = api.set_source(stack, source)
    _stack_view(stack, view, output)


@source_app.command("show", epilog=exit_codes(NO_SOURCE, "a bad name"))
def show_source(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """The stack's git source (never its secret)."""
    check_names(project=project, workspace=workspace)
    stack = StackRef(project, workspace)
    with api_client() as api:
        view = api.source(stack)
    _stack_view(stack, view, output)


@source_app.command("unset", epilog=exit_codes(NO_SOURCE, "a bad name"))
def unset_source(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Unbind the stack from its git source (through the API: an approver's)."""
    check_names(project=project, workspace=workspace)
    stack = StackRef(project, workspace)
    with api_client() as api:
        api.unset_source(stack)
    if output is OutputFormat.json:
        print_json({"project": stack.project, "workspace": stack.workspace, "removed": True})
    else:
        echo_safe(f"{stack}: git source removed (pushes start nothing any more)")
