"""`stackflow set …` through the HTTP API (``STACKFLOW_API_URL``): the set file sent to
``POST /v1/sets/{name}/runs`` with its specs inline (the API checks and stores them as the
CLI does directly), the run followed through ``GET /v1/sets/{name}/runs/{run_id}``; and the
set table both ways print."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from stackflow.cli.api_mode import api_client
from stackflow.cli.runs import RunPaused
from stackflow.core.errors import StackflowError
from stackflow.temporal.stack_set import SetOperation, SetView

if TYPE_CHECKING:
    from rich.console import Console

FINAL = ("succeeded", "failed")


def show(console: Console, view: SetView) -> None:
    """The set as a table: one line per stack."""
    from rich.table import Table
    from rich.text import Text

    table = Table("Stack", "Phase", "Revision", "Changes / results", "Known after apply", "Error")
    for m in view.members:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m.counts.items()) if v)
        more = m.unknown_count - len(m.unknown)
        unknown = "\n".join(m.unknown) + (f"\n(and {more} more)" if more > 0 else "")
        table.add_row(
            Text(str(m.stack)),
            Text(str(m.phase)),
            "" if m.revision is None else str(m.revision),
            Text(counts or "-"),
            Text(unknown),
            Text(m.error or ""),
        )
    console.print(table)
    line = f"set {view.name}: {view.operation} {view.phase}"
    if view.wave is not None:
        line += f" (wave {view.wave + 1})"
    if view.rolled_back:
        line += f"; rolled back: {', '.join(view.rolled_back)}"
    console.print(Text(line))


def paused(name: str, view: SetView) -> RunPaused:
    failed = sum(m.phase == "failed" for m in view.members)
    return RunPaused(
        f"set {name} paused: {failed} stack(s) failed; run them again with `stackflow set "
        f"retry --set {name}` or end the run with `stackflow set abort --set {name}`"
    )


def body_of(file: str, operation: SetOperation, **options: Any) -> tuple[str, dict[str, Any]]:
    """The set file as ``POST /v1/sets/{name}/runs`` takes it: its name and the body."""
    from stackflow.engine.spec import load_spec
    from stackflow.engine.stack_set import load_set_file

    shop = load_set_file(file)
    base = Path(file).parent
    destroy = operation == SetOperation.destroy
    members = []
    for m in shop.stacks:
        member: dict[str, Any] = {
            "project": m.project,
            "workspace": m.workspace,
            "depends_on": m.depends_on,
            "context": m.context,
        }
        if not destroy and m.spec is not None:
            member["spec"] = load_spec(base / m.spec).model_dump(mode="json", by_alias=True)
        elif not destroy and m.git is not None:
            member["source"] = m.git.source().model_dump(mode="json")
        members.append(member)
    body: dict[str, Any] = {"operation": operation.value, "members": members, **options}
    if operation == SetOperation.apply and shop.strategy is not None:
        body["strategy"] = shop.strategy.model_dump(mode="json")
    return shop.name, body


def run_through_api(
    file: str, operation: SetOperation, yes: bool, console: Console, **options: Any
) -> SetView:
    """Start the set run through the API, ask for its approval once, follow it to its end."""
    name, body = body_of(file, operation, **options)
    with api_client() as api:
        created = api.request("POST", f"/v1/sets/{name}/runs", json=body)
        url = created["status_url"]
        typer.echo(f"set run: {created['workflow_id']} ({created['run_id']})", err=True)
        asked = False
        while (view := SetView.model_validate(api.request("GET", url))).phase not in FINAL:
            if view.phase == "awaitingDecision":
                show(console, view)
                raise paused(name, view)
            if view.phase == "awaitingApproval" and not asked:
                asked = True
                show(console, view)
                step = (
                    "approve" if yes or typer.confirm("Apply these stacks?", err=True) else "reject"
                )
                try:
                    api.request("POST", f"{url}/{step}")
                except StackflowError as exc:  # four-eyes: another person approves
                    typer.echo(f"{exc}; waiting for `stackflow set approve --set {name}`", err=True)
            time.sleep(0.5)
        return view


def latest_through_api(name: str) -> SetView:
    with api_client() as api:
        return SetView.model_validate(api.request("GET", f"/v1/sets/{name}/runs/latest"))


def steer_through_api(name: str, step: str) -> str:
    with api_client() as api:
        said = api.request("POST", f"/v1/sets/{name}/runs/latest/{step}")
    return str(said.get("result", step))
