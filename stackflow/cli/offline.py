"""Commands that work on files and the state backend: validate, graph, release list/show/
diff/unlock/import/export, output. Only `release unlock` asks Temporal (whether the holding
run is alive). With ``STACKFLOW_API_URL`` the release commands go through the API
(:mod:`stackflow.cli.remote_releases`)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stackflow.cli import remote_releases
from stackflow.cli.api_mode import api_client, api_mode, not_through_api
from stackflow.cli.app import app, release_app
from stackflow.cli.options import FileOpt, OutputOpt, ProjectOpt, WorkspaceOpt
from stackflow.cli.output import (
    OutputFormat,
    emit,
    print_json,
    stderr_console,
    stdout_console,
)
from stackflow.cli.render import render_policy
from stackflow.core.errors import NotFoundError, SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.graph import Graph, build_graph
from stackflow.engine.masking import masked_release_data
from stackflow.engine.spec import load_spec
from stackflow.model.release import Release, Unlocked


class GraphFormat(StrEnum):
    table = "table"
    json = "json"
    dot = "dot"


@app.command()
def validate(file: FileOpt) -> None:
    """Check a spec: shape, id conventions, dependencies, references, cycles."""
    spec = load_spec(file)
    layers = build_graph(spec).layers()
    typer.echo(f"valid: {_count(len(spec.resources), 'resource')}, {_count(len(layers), 'layer')}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def graph_json(graph: Graph) -> dict[str, Any]:
    return {"layers": graph.layers(), "edges": [list(edge) for edge in graph.edges]}


def graph_dot(graph: Graph) -> str:
    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["digraph stackflow {", "  rankdir=LR;"]
    lines += [f"  {q(rid)};" for rid in graph.ids]
    lines += [f"  {q(dep)} -> {q(rid)};" for dep, rid in graph.edges]
    lines.append("}")
    return "\n".join(lines)


@app.command()
def graph(
    file: FileOpt,
    output: Annotated[
        GraphFormat, typer.Option("--output", "-o", help="table, json or dot (Graphviz).")
    ] = GraphFormat.table,
) -> None:
    """Show the dependency graph: layers in apply order (edges: dependency -> dependent)."""
    g = build_graph(load_spec(file))
    if output is GraphFormat.dot:
        typer.echo(graph_dot(g))
        return

    def table(console: Console) -> None:
        for number, layer in enumerate(g.layers(), 1):
            console.print(f"[bold]Layer {number}[/bold]")
            for rid in layer:
                deps = g.dependencies(rid)
                after = f"  [dim](after {escape(', '.join(deps))})[/dim]" if deps else ""
                console.print(f"  {escape(rid)}{after}", highlight=False, soft_wrap=True)

    emit(OutputFormat(output.value), lambda: graph_json(g), table)


def _release_summary(r: Release) -> dict[str, Any]:
    return {
        "revision": r.revision,
        "operation": r.operation.value,
        "source_revision": r.source_revision,
        "source": r.source.model_dump(mode="json") if r.source else None,
        "phase": r.phase.value,
        "resources": r.resource_count if r.resource_count is not None else len(r.state.resources),
        "created_at": r.created_at.isoformat(),
        "modified_at": r.modified_at.isoformat(),
        "error": r.error,
        "set_run": r.set_run,
    }


@release_app.command("list")
def release_list(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """List the releases of a stack."""
    releases = remote_releases.list_releases(StackRef(project, workspace))

    def table(console: Console) -> None:
        t = Table()
        for name in ("Rev", "Operation", "Phase", "Resources", "Modified"):
            t.add_column(name, no_wrap=True)
        by_sets = any(r.set_run for r in releases)
        if by_sets:  # the set run that made it (`stackflow set status`)
            t.add_column("Set run", no_wrap=True)
        with_errors = any(r.error for r in releases)
        if with_errors:
            # One line per release: the whole error is in `release show` and the JSON form.
            t.add_column("Error", no_wrap=True)
        for r in releases:
            count = r.resource_count if r.resource_count is not None else len(r.state.resources)
            operation = r.operation.value + (
                f" ← {r.source_revision}" if r.source_revision is not None else ""
            )
            if r.source is not None:
                operation += f" @{r.source.commit[:12]}"
            row = [str(r.revision), operation, r.phase.value, str(count)]
            row.append(r.modified_at.strftime("%Y-%m-%d %H:%M"))
            if by_sets:
                row.append(r.set_run or "")
            error = " ".join((r.error or "").split())
            room = max(12, console.width - 66)  # what the other columns leave on this terminal
            error = error if len(error) <= room else error[: room - 1] + "…"
            t.add_row(*row, *([Text(error)] if with_errors else []))  # never markup
        console.print(t)

    emit(output, lambda: [_release_summary(r) for r in releases], table)


@release_app.command("show")
def release_show(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    revision: Annotated[
        int | None, typer.Option("--revision", "-r", help="Default: the latest.")
    ] = None,
    output: OutputOpt = OutputFormat.table,
    diff: Annotated[
        bool, typer.Option("--diff", help="Also the preview's full diff (every field).")
    ] = False,
) -> None:
    """Show one release (default: the latest) with its resources."""
    stack = StackRef(project, workspace)
    release = remote_releases.release(stack, revision)
    if release is None:
        raise NotFoundError(f"stack {stack} has no releases")

    changes = None
    if diff:
        from stackflow.cli.remote import full_changes

        changes = release.changes or {"changes": [], "summary": {}}
        changes = changes if api_mode() else full_changes(changes)

    def table(console: Console) -> None:
        for key, value in _release_summary(release).items():
            if key == "source" and release.source is not None:
                s = release.source
                value = f"{s.path} at {s.commit} of {s.url}"
            if value is not None:
                console.print(
                    f"[bold]{key}:[/bold] {escape(str(value))}", highlight=False, soft_wrap=True
                )
        if release.policy is not None:
            render_policy(release.policy.model_dump(mode="json"), console, digests=True)
        t = Table("ID", "Type", title="State")
        for resource in release.state.resources:
            t.add_row(Text(resource.id), str(resource.type))
        console.print(t)
        if changes is not None:
            from stackflow.cli.render import render_preview
            from stackflow.engine.diff import Preview

            render_preview(Preview.model_validate(changes), console, detail=True)

    def data() -> dict[str, Any]:
        out = masked_release_data(release)
        if changes is not None:
            out["diff"] = changes
        return out

    emit(output, data, table)


@release_app.command("unlock")
def release_unlock(
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Unlock even while the holding run is open (its later writes are refused).",
        ),
    ] = False,
) -> None:
    """Free a stack whose run ended without releasing it; its release becomes failed.

    Refused while the holding run is still open in Temporal (TEMPORAL_ADDRESS), unless
    --force. The next operation recovers such a stack by itself, so this is rarely needed.
    Through the API: an approver's.
    """
    with api_client() as api:
        done = Unlocked.model_validate(api.unlock(StackRef(project, workspace), force=force))
    typer.echo(done.line())


@release_app.command("import")
def release_import(
    kusion_home: Annotated[
        Path, typer.Option("--kusion-home", help="Kusion's home directory.")
    ] = Path("~/.kusion"),
) -> None:
    """Import a Kusion user's release history (every project/workspace/revision); only into
    stacks with no releases (through the API: an approver's)."""
    from stackflow.state.kusion import read_kusion_home

    imported = remote_releases.import_stacks(read_kusion_home(kusion_home.expanduser()))
    console = stdout_console()
    for stack, count in imported.items():
        console.print(f"imported {count} release(s) of {stack}", highlight=False)
    if not imported:
        console.print("nothing to import", highlight=False)


@release_app.command("export")
def release_export(
    kusion_layout: Annotated[
        Path,
        typer.Option(
            "--kusion-layout",
            help="Directory to write Kusion's layout into: releases/<project>/<workspace>/.",
        ),
    ],
    project: Annotated[
        str | None,
        typer.Option("--project", "-p", help="Only this project (through the API: required)."),
    ] = None,
    workspace: Annotated[
        str | None, typer.Option("--workspace", "-w", help="Only this workspace.")
    ] = None,
) -> None:
    """Write releases as Kusion keeps them (<n>.yaml and .metadata.yml), sensitive values
    masked, files 0600."""
    if project:
        written = remote_releases.export_stacks(kusion_layout.expanduser(), project, workspace)
    elif api_mode():
        raise SpecError(
            "--project: through the HTTP API the export is of one project's stacks "
            "(give --project, and --workspace for one stack)"
        )
    else:  # every project: the state backend of this machine
        from stackflow.state.backend import open_backend  # this machine's only

        store = open_backend()
        try:
            from stackflow.state.kusion import export_kusion_releases

            written = export_kusion_releases(store, kusion_layout.expanduser(), project, workspace)
        finally:
            store.close()
    console = stdout_console()
    for stack, count in written.items():
        console.print(f"exported {count} release(s) of {stack}", highlight=False)
    if not written:
        console.print("nothing to export", highlight=False)


@release_app.command("diff")
def release_diff(
    old: Annotated[int, typer.Argument(metavar="A", help="The revision to compare from.")],
    new: Annotated[int, typer.Argument(metavar="B", help="The revision to compare to.")],
    project: ProjectOpt,
    workspace: WorkspaceOpt = "default",
    output: OutputOpt = OutputFormat.table,
) -> None:
    """What changed from revision A to revision B: resources added, removed and changed in
    the spec and in the recorded state, with the fields that differ. Sensitive values are
    masked on both sides; a changed one says so without its values."""

    found = remote_releases.release_diff(StackRef(project, workspace), old, new)
    emit(output, lambda: found.model_dump(mode="json"), lambda c: _render_release_diff(found, c))


_MARKS = {"added": ("+", "green"), "removed": ("-", "red"), "changed": ("~", "yellow")}


def _shown(value: Any, room: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= room else text[: room - 1] + "…"


def _field_line(change: Any) -> Text:
    from stackflow.engine.release_diff import FieldChangeKind

    line = Text(f"      {change.path}: ")
    kind = change.kind
    if kind is FieldChangeKind.unknown:
        line.append("sealed, cannot compare without the encryption keys", style="dim")
    elif change.sensitive and kind is FieldChangeKind.changed:
        line.append("changed (sensitive)", style="yellow")
    elif change.sensitive:
        line.append(f"{kind.value} (sensitive)", style=_MARKS[kind.value][1])
    elif kind is FieldChangeKind.added:
        line.append(f"+ {_shown(change.new)}", style="green")
    elif kind is FieldChangeKind.removed:
        line.append(f"- {_shown(change.old)}", style="red")
    else:
        line.append(_shown(change.old), style="red")
        line.append(" → ")
        line.append(_shown(change.new), style="green")
    return line


def _render_release_diff(found: Any, console: Console) -> None:
    head = f"{found.stack}: revision {found.old_revision} → {found.new_revision}"
    console.print(Text(head, style="bold"), soft_wrap=True)
    if found.empty:
        console.print("no changes", highlight=False)
        return
    sections = (("Spec", found.spec), ("State", found.state))
    for title, section in sections:
        counts = section.summary
        summary = ", ".join(f"{counts[k]} {k}" for k in ("added", "removed", "changed"))
        console.print(
            Text(f"{title}: {summary}, {counts['unchanged']} unchanged", style="bold"),
            soft_wrap=True,
        )
        if title == "Spec" and found.spec.missing:
            missing = ", ".join(map(str, found.spec.missing))
            console.print(
                Text(f"  not compared: no spec recorded in revision {missing}", style="dim"),
                soft_wrap=True,
            )
        if title == "Spec" and found.spec.fields:
            console.print(Text("  ~ spec settings", style="yellow"), soft_wrap=True)
            for change in found.spec.fields:
                console.print(_field_line(change), soft_wrap=True, highlight=False)
        for resource in section.resources:
            mark, style = _MARKS[resource.change.value]
            line = Text(f"  {mark} {resource.id}", style=style)
            kind = (
                resource.type
                if resource.old_type is None
                else (f"{resource.old_type} → {resource.type}")
            )
            line.append(f"  ({kind})", style="dim")
            console.print(line, soft_wrap=True, highlight=False)
            for change in resource.fields:
                console.print(_field_line(change), soft_wrap=True, highlight=False)
            for dep in resource.depends_on_added:
                console.print(Text(f"      dependsOn: + {dep}", style="green"), soft_wrap=True)
            for dep in resource.depends_on_removed:
                console.print(Text(f"      dependsOn: - {dep}", style="red"), soft_wrap=True)
            for change in resource.extensions:
                change = change.model_copy(update={"path": f"extensions.{change.path}"})
                console.print(_field_line(change), soft_wrap=True, highlight=False)


@app.command()
def output(
    project: ProjectOpt,
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="ID[.PATH]",
            help="A resource id, optionally followed by a dotted path into its attributes "
            "(list items by number: svc.spec.ports.0.port). A single value prints plain.",
        ),
    ] = None,
    workspace: WorkspaceOpt = "default",
    resource: Annotated[
        str | None, typer.Option("--resource", "-r", help="Only this resource id.")
    ] = None,
    show_sensitive: Annotated[
        bool,
        typer.Option(
            "--show-sensitive",
            help="Print sensitive values in clear (the one way to see them; needs the keys).",
        ),
    ] = False,
    out: Annotated[
        OutputFormat | None,
        typer.Option(
            "--output",
            "-o",
            help="json, or table: a single value plain (for $(...)), else a table. "
            "Default: table with ID[.PATH], json without.",
        ),
    ] = None,
) -> None:
    """The recorded attributes of the stack's resources (latest release), or one value of
    them, sensitive values masked unless --show-sensitive."""
    from stackflow.core.crypto import EncryptionKeyError
    from stackflow.core.errors import SpecError
    from stackflow.engine.masking import mask_recorded, release_sensitive_paths
    from stackflow.engine.release_diff import lookup, still_sealed

    if target is not None and resource is not None:
        raise SpecError("give a resource as ID[.PATH] or as --resource, not both")
    stack = StackRef(project, workspace)
    if api_mode() and show_sensitive:
        raise not_through_api("--show-sensitive")
    if show_sensitive:  # the state backend's values: this machine's, never the API's
        from stackflow.api.releases import readable
        from stackflow.state.backend import open_backend  # this machine's only

        store = open_backend()
        try:
            latest = readable(store, stack, None)
        finally:
            store.close()
        spec = None if latest is None else latest.spec
    else:  # masked by the API: its spec adds nothing
        latest, spec = remote_releases.release(stack, None), None
    if latest is None:
        raise NotFoundError(f"stack {stack} has no releases")
    sensitive = release_sensitive_paths(spec, latest.state.resources)
    where = f"release {latest.revision} of {stack}"

    def sealed_check(what: str, value: Any) -> None:
        if show_sensitive and still_sealed(value):
            raise EncryptionKeyError(
                f"{what} is sealed and this process has no encryption keys "
                "(STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE)"
            )

    if target is not None:
        found = lookup(
            target,
            latest.state.resources,
            sensitive,
            show_sensitive=show_sensitive,
            where=where,
        )
        name = f"{found.id}.{found.path}" if found.path else found.id
        sealed_check(name, found.value)
        if found.sensitive and not show_sensitive:
            stderr_console().print(
                f"note: {name} holds sensitive values (masked); --show-sensitive prints them",
                style="dim",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        if (out or OutputFormat.table) is OutputFormat.json:
            print_json(found.value)
        else:
            _print_plain(found.value)
        return
    chosen = [r for r in latest.state.resources if resource is None or r.id == resource]
    if resource is not None and not chosen:
        raise NotFoundError(f"{resource}: not in {where}")
    data = {
        r.id: dict(r.attributes)
        if show_sensitive
        else mask_recorded(r.attributes, sensitive.get(r.id, ()))
        for r in chosen
    }
    for rid, attributes in data.items():
        sealed_check(rid, attributes)

    def table(console: Console) -> None:
        t = Table("ID", "Attributes")
        for rid, attributes in data.items():
            t.add_row(Text(rid), Text(json.dumps(attributes, sort_keys=True, default=str)))
        console.print(t)

    emit(out or OutputFormat.json, lambda: data, table)


def _print_plain(value: Any) -> None:
    """A string as it is, another scalar as JSON (80, true, null), anything else as JSON."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict | list):
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    else:
        text = json.dumps(value, default=str)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
