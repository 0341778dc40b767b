"""`stackflow policy push|show|eval|test`, and ``--policy DIR`` of preview/apply/destroy.

A bundle is every ``*.rego`` file of a directory (``package stackflow``: each module one
policy; rules ``deny``, ``warn``, ``require_approval``; any other package is a library a
policy of the bundle must import, else the bundle is refused). ``push`` stores it (content-
addressed) in the state backend as the project's; ``--policy DIR`` stores it for one run.
``eval`` prints the input document the policies read for a spec (from a preview), ``test``
evaluates a bundle against it (or, offline, against an input document saved before)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from stackflow.cli.api_mode import refuse_in_api_mode
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.options import FileOpt, OutputOpt, ProjectOpt, WorkspaceOpt
from stackflow.cli.output import OutputFormat, print_json
from stackflow.core.errors import SpecError
from stackflow.model.policy import PolicyDecision
from stackflow.policy_gate.bundle import PolicyBundle, load_bundle_dir, problem_of

policy_app = typer.Typer(
    help="Policy-as-code (Rego, package stackflow): push a project's bundle, see the input "
    "document policies read, test a bundle against a spec.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(policy_app, name="policy")

PolicyDirOpt = Annotated[
    str | None, typer.Option("--policy", help="Directory of .rego modules for this run only.")
]


@policy_app.command("push")
def push(
    project: ProjectOpt,
    directory: Annotated[
        str | None, typer.Argument(help="Directory of .rego modules (package stackflow).")
    ] = None,
    git: Annotated[
        str | None,
        typer.Option("--git", help="A git repository (http(s), file:// or a path) instead of DIR."),
    ] = None,
    ref: Annotated[str, typer.Option("--ref", help="With --git: the branch.")] = "main",
    path: Annotated[
        str, typer.Option("--path", help="With --git: the directory of the modules.")
    ] = ".",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Store DIR's modules (or those under --path at the head of --ref in --git) as the
    project's bundle: every later run of the project evaluates it."""
    from stackflow.cli.api_mode import api_client

    if (directory is None) == (git is None):
        raise SpecError("give the bundle's directory, or --git URL (with --ref, --path)")
    commit = None
    if git is not None:
        commit, bundle = _bundle_from_git(git, ref, path)
    else:
        bundle = load_bundle_dir(directory or "")
    with api_client() as client:
        digest = client.push_policy(project, bundle).digest
    result: dict[str, Any] = {
        "project": project,
        "digest": digest,
        "modules": sorted(bundle.modules),
    }
    if commit is not None:
        result["source"] = {"url": git, "ref": ref, "path": path, "commit": commit}
    if output == OutputFormat.json:
        print_json(result)
        return
    at = f" from {git} {ref} @{commit[:12]}" if commit else ""
    typer.echo(f"project {project}: policy bundle {digest} ({len(bundle.modules)} modules){at}")


def _bundle_from_git(url: str, ref: str, path: str) -> tuple[str, PolicyBundle]:
    """The ``.rego`` modules under ``path`` at the head of ``ref`` (tests left out), and
    that commit: the bundle is pinned to it."""
    from stackflow.state.git_sources import git_cache, read_directory

    try:
        # the CLI reads what its user can read: a local repository needs no worker's roots
        commit, files = read_directory(url, ref, path, git_cache(), ".rego", any_local=True)
    except ValueError as exc:
        raise SpecError(f"--git {url}: {exc}") from None
    modules = {name: text for name, text in files.items() if not name.endswith("_test.rego")}
    if not modules:
        raise SpecError(f"--git {url}: no .rego files under {path} at {ref} ({commit[:12]})")
    try:
        return commit, PolicyBundle(modules=modules)
    except ValueError as exc:
        raise SpecError(f"--git {url}: {problem_of(exc)}") from None


@policy_app.command("show")
def show(project: ProjectOpt, output: OutputOpt = OutputFormat.table) -> None:
    """The project's bundle: digest, who pushed it, its modules."""
    from stackflow.cli.api_mode import api_client
    from stackflow.client.types import to_json

    with api_client() as client:
        result = to_json(client.policy(project))
    if output == OutputFormat.json:
        print_json(result)
        return
    typer.echo(f"project {project}: {result['digest']}, pushed by {result['updated_by']}")
    for module in result["modules"]:
        typer.echo(f"  {module}")


def _preview_decision(
    file: str, project: str, workspace: str, directory: str | None
) -> tuple[PolicyDecision | None, str | None]:
    """Run a preview of ``file`` that keeps its policy input; the decision (from the run's
    events: a denial fails the preview) and the run's failure, if any."""
    from stackflow.cli.api_mode import api_client
    from stackflow.cli.remote import RemoteRun, spec_text
    from stackflow.client.types import Stack
    from stackflow.core.errors import StackflowError

    stack = Stack(project, workspace)
    body: dict[str, Any] = {"operation": "preview", "spec_yaml": spec_text(file)}
    body["policy_input"] = True
    if directory is not None:
        body["policy"] = load_bundle_dir(directory).model_dump(mode="json", exclude_unset=True)
    decision: PolicyDecision | None = None
    failure: str | None = None
    with api_client() as client:
        remote = RemoteRun(client, stack, "PreviewWorkflow", OutputFormat.json)
        remote.run_id = client.start_run(stack, body).run_id
        with client.events(stack, remote.run_id) as stream:
            for event in stream:
                if event.type == "policy_decision":
                    decision = PolicyDecision.model_validate(event.data)
        try:
            remote.final()
        except StackflowError as exc:
            if decision is None:
                raise
            failure = str(exc)
    return decision, failure


def _input_document(digest: str) -> dict[str, Any]:
    from stackflow.policy_gate.plan_input import INPUT_KIND
    from stackflow.state.backend import open_backend

    backend = open_backend()
    try:
        doc: dict[str, Any] = json.loads(backend.get_blob(INPUT_KIND, digest))
        return doc
    finally:
        backend.close()


@policy_app.command("eval")
def eval_input(file: FileOpt, project: ProjectOpt, workspace: WorkspaceOpt = "default") -> None:
    """Print the input document policies read for FILE (the masked plan of a preview)."""
    refuse_in_api_mode("policy eval")
    decision, _ = _preview_decision(file, project, workspace, None)
    if decision is None:
        raise SpecError("the preview kept no policy input (is the worker older than the CLI?)")
    print_json(_input_document(decision.input_digest))


@policy_app.command("test")
def test(
    policy: Annotated[str, typer.Option("--policy", help="Directory of .rego modules.")],
    file: Annotated[
        str | None, typer.Option("--file", "-f", help="Spec file: judged through a preview.")
    ] = None,
    input_file: Annotated[
        str | None,
        typer.Option("--input", help="An input document (stackflow policy eval): offline."),
    ] = None,
    project: Annotated[str | None, typer.Option("--project", "-p")] = None,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Evaluate the bundle at --policy against a spec's preview (-f, -p) or, offline,
    against a saved input document (--input); exit 2 when it denies."""
    if (file is None) == (input_file is None):
        raise SpecError("give one of --file (with --project) and --input")
    if input_file is not None:
        decision = _offline(policy, input_file)
    else:
        if project is None:
            raise SpecError("--file needs --project (the stack whose preview is judged)")
        found, failure = _preview_decision(file or "", project, workspace, policy)
        if found is None:
            raise SpecError(failure or "the preview returned no policy decision")
        decision = found
    if output == OutputFormat.json:
        print_json(decision.model_dump(mode="json", exclude_none=True))
    else:
        from stackflow.cli.render import render_policy

        render_policy(decision.model_dump(mode="json"), Console(highlight=False))
    if decision.outcome == "deny":
        raise typer.Exit(2)


def _offline(directory: str, input_file: str) -> PolicyDecision:
    import time

    from stackflow.policy_gate.engine import Module, evaluate
    from stackflow.policy_gate.plan_input import input_bytes
    from stackflow.state.models import blob_ref

    bundle = load_bundle_dir(directory)
    raw = sys.stdin.buffer.read() if input_file == "-" else Path(input_file).read_bytes()
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise SpecError(f"{input_file}: not JSON ({exc})") from None
    body = input_bytes(document)
    modules = [Module(policy=f"run/{p}", source=s) for p, s in bundle.modules.items()]
    started = time.perf_counter()
    messages, policies = evaluate(modules, body)
    return PolicyDecision.of(
        messages,
        bundles=[],
        input_digest=blob_ref(body),
        policies=policies,
        evaluated_at=None,
        duration_ms=round((time.perf_counter() - started) * 1000),
    )
