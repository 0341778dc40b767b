"""The web UI's pages: the stacks a person may view, a stack's runs, a run (its status, the
preview as a per-resource field diff a page at a time, the policy decision, its live events,
and the steps the person's role allows), a stack's releases, one release and the diff of two,
and a stack set's latest run with its stacks.

Every read and every step is the API's own function (:mod:`stackflow.api.runs`,
:mod:`stackflow.api.releases`, :func:`stackflow.api.runs.take_step`) with the person's
identity, and needs the role the API's route of it needs (:func:`stackflow.api.routes.require`)."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from stackflow.api import events, releases, runs, sets
from stackflow.api.context import ApiContext
from stackflow.api.identity import Identity, Role
from stackflow.api.models import RunOperation
from stackflow.api.routes import STEPS, ProjectPath, Revision, RunIdPath, WorkspacePath, require
from stackflow.api.ui import session
from stackflow.api.ui.base import (
    HERE,
    UiRoute,
    ctx_of,
    posted,
    render,
    secret_of,
    signed_in,
    templates,
)
from stackflow.client.types import RunSummary, RunView
from stackflow.core.errors import NotFoundError
from stackflow.core.refs import StackRef
from stackflow.model.events import EventType
from stackflow.model.release import Phase
from stackflow.temporal.operation import StatusView

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
PAGE_SIZE = 50
"""Resources of a preview shown per page."""
RUNS_PAGE = 50
LIST_QUERY = timedelta(seconds=3)
"""How long the list waits for a running run's phase (else it shows it as running)."""
STATIC = {
    name: (HERE.joinpath("static", name).read_bytes(), kind)
    for name, kind in (
        ("ui.css", "text/css; charset=utf-8"),
        ("ui.js", "text/javascript; charset=utf-8"),
    )
}
ROLES = {action: role for action, role, _ in STEPS}
LABELS = {"approve": "Approve", "reject": "Reject", "retry": "Retry failed", "abort": "Abort"}
PREVIEWING = (None, "generating", "previewing")


def show(value: Any) -> str:
    """A field's value as the CLI's diff shows it."""
    if value is None:
        return "<none>"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


templates.filters["show"] = show
templates.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False)


def base_of(stack: StackRef) -> str:
    return f"/ui/s/{quote(stack.project, safe='')}/{quote(stack.workspace, safe='')}"


def viewer(request: Request, project: str) -> Identity:
    return require(signed_in(request)[1], project, Role.viewer)


@router.get("/static/{name}")
async def static(name: Annotated[str, Path(max_length=40)]) -> Response:
    if name not in STATIC:
        raise NotFoundError(f"no static file {name}")
    body, kind = STATIC[name]
    return Response(body, media_type=kind)


@router.get("/")
async def home(request: Request) -> Response:
    """The stacks (with releases) of the projects the person may view."""
    me = signed_in(request)[1]
    ctx = ctx_of(request)
    stacks = [s for s in await ctx.state(ctx.backend.stacks) if me.allows(s.project, Role.viewer)]
    return render(request, "home.html", stacks=stacks, base_of=base_of)


@router.get("/s/{project}/{workspace}")
async def run_list(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    phase: Annotated[str, Query(max_length=20)] = "",
    operation: Annotated[str, Query(max_length=20)] = "",
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> Response:
    """The stack's runs, running first then newest, with their phase; filtered by phase
    and operation."""
    viewer(request, project)
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    page = await runs.list_runs(ctx, stack, RUNS_PAGE, page_token)
    listed = [r for r in page.runs if not operation or r.operation == operation]
    phases = await phases_of(ctx, stack, listed)
    shown = [(r, phases[r.run_id]) for r in listed if not phase or phases[r.run_id] == phase]
    return render(
        request,
        "runs.html",
        stack=stack,
        base=base_of(stack),
        runs=shown,
        phase=phase,
        operation=operation,
        phases=[p.value for p in Phase],
        operations=[o.value for o in RunOperation],
        next_token=page.next_page_token,
    )


async def phases_of(ctx: ApiContext, stack: StackRef, listed: list[RunSummary]) -> dict[str, str]:
    """Each run's phase: a running one's from its ``status`` query (the stack runs few at
    once), a closed one's from the release it made, else its status (a preview's)."""
    made = {r.run_id: r.phase.value for r in await ctx.state(lambda: ctx.backend.list(stack))}
    client = await ctx.client()

    async def phase_of(run: RunSummary) -> str:
        if run.status != "running":
            return made.get(run.run_id) or ("failed" if run.status != "completed" else "completed")
        handle = client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        try:
            status = await handle.query("status", result_type=StatusView, rpc_timeout=LIST_QUERY)
        except Exception:  # a drift check has no status query; a run without a worker
            return "running"
        return str(status.phase)

    found = await asyncio.gather(*(phase_of(r) for r in listed))
    return {r.run_id: p for r, p in zip(listed, found, strict=True)}


@dataclass
class Step:
    action: str
    label: str
    reason: str | None = None
    """Why the person may not take it now (the button is shown disabled, saying so)."""


def steps_for(view: RunView, me: Identity, project: str, four_eyes: bool) -> list[Step]:
    """The steps the person's role allows on the run in its phase."""
    if view.status != "running":
        return []
    wanted = {"awaitingApproval": ("approve", "reject"), "awaitingDecision": ("retry", "abort")}
    found = []
    for action in (*wanted.get(view.phase or "", ()), "cancel"):
        if not me.allows(project, ROLES[action]):
            continue
        reason = None
        if action == "approve" and four_eyes and view.requested_by == me.name:
            reason = (
                f"four-eyes: {me.name} started this run and may not approve it; "
                "another approver must"
            )
        found.append(Step(action, LABELS.get(action, "Cancel run"), reason))
    return found


async def run_status(
    ctx: ApiContext, stack: StackRef, run_id: str, me: Identity
) -> tuple[RunView, list[Step]]:
    handle, described = await runs.find_run(ctx, stack, run_id)
    described = await runs.closed_if_ending(ctx, stack, handle, described)
    view = await runs.run_view(ctx, stack, handle, described)
    four_eyes = False
    if view.phase == "awaitingApproval":
        last = await ctx.state(lambda: ctx.backend.last_event(stack, run_id))
        four_eyes = bool(
            last and last.type == EventType.approval_wait and last.data.get("four_eyes")
        )
    return view, steps_for(view, me, stack.project, four_eyes)


SETTLED: OrderedDict[tuple[StackRef, str], dict[str, Any] | None] = OrderedDict()
"""Runs seen past previewing, by stack and run id (found as the stack's by ``find_run``),
with their preview once read after that (a settled preview never changes): the page of a
waiting run queries its preview once, not every time."""
SETTLED_LIMIT = 16


def settled(key: tuple[StackRef, str], preview: dict[str, Any] | None = None) -> None:
    SETTLED[key] = preview
    SETTLED.move_to_end(key)
    while len(SETTLED) > SETTLED_LIMIT:
        SETTLED.popitem(last=False)


async def preview_of(ctx: ApiContext, stack: StackRef, run_id: str) -> dict[str, Any]:
    """The run's preview (the API's ``…/preview``), NotFoundError when it has none."""
    key = (stack, run_id)
    known = key in SETTLED
    kept = SETTLED.get(key)
    if kept is not None:
        return kept
    handle, described = await runs.find_run(ctx, stack, run_id)
    preview = await runs.preview_of(ctx, handle, described)
    if known:  # settled before this query was sent
        settled(key, preview)
    return preview


async def preview_values(
    ctx: ApiContext, stack: StackRef, run_id: str, page: int
) -> dict[str, Any]:
    """The preview's page ``page`` (1-based) and its policy decision."""
    try:
        preview = await preview_of(ctx, stack, run_id)
    except NotFoundError as err:
        return {"preview": None, "no_preview": str(err), "changes": [], "policy": None}
    changes = preview.get("changes") or []
    pages = max(1, -(-len(changes) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    return {
        "preview": preview,
        "no_preview": "",
        "changes": changes[(page - 1) * PAGE_SIZE : page * PAGE_SIZE],
        "listed": len(changes),
        "page": page,
        "pages": pages,
        "policy": preview.get("policy"),
    }


RUN = "/s/{project}/{workspace}/runs/{run_id}"


@router.get(RUN)
async def run_page(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    run_id: RunIdPath,
    page: Annotated[int, Query(ge=1, le=10**6)] = 1,
) -> Response:
    found, me = signed_in(request)
    require(me, project, Role.viewer)
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    (view, steps), values = await asyncio.gather(
        run_status(ctx, stack, run_id, me), preview_values(ctx, stack, run_id, page)
    )
    response = render(
        request,
        "run.html",
        stack=stack,
        base=base_of(stack),
        run=f"{base_of(stack)}/runs/{run_id}",
        view=view,
        steps=steps,
        said=found.flash,
        event_types=" ".join(t.value for t in EventType),
        **values,
    )
    if found.flash:  # shown once
        session.write(
            request, response, found.model_copy(update={"flash": None}), secret_of(request)
        )
    return response


@router.get(RUN + "/status")
async def status_part(
    request: Request, project: ProjectPath, workspace: WorkspacePath, run_id: RunIdPath
) -> Response:
    """The run page's status section (the page's script fetches it as events arrive)."""
    me = viewer(request, project)
    stack = StackRef(project, workspace)
    view, steps = await run_status(ctx_of(request), stack, run_id, me)
    run = f"{base_of(stack)}/runs/{run_id}"
    return render(request, "_status.html", view=view, steps=steps, run=run)


@router.get(RUN + "/preview")
async def preview_part(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    run_id: RunIdPath,
    page: Annotated[int, Query(ge=1, le=10**6)] = 1,
) -> Response:
    """The run page's preview section (fetched again once the preview is settled)."""
    viewer(request, project)
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    run = f"{base_of(stack)}/runs/{run_id}"
    values = await preview_values(ctx, stack, run_id, page)
    return render(request, "_preview.html", run=run, **values)


@router.get(RUN + "/events")
async def event_part(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    run_id: RunIdPath,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """The run's events as Server-Sent Events (the API's stream, in the person's slots)."""
    me = viewer(request, project)
    stack = StackRef(project, workspace)
    start = events.cursor(None, last_event_id)
    return await events.event_stream(ctx_of(request), stack, run_id, me, start, events.SSE)


@router.post(RUN + "/{action}")
async def take_step(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    run_id: RunIdPath,
    action: Annotated[str, Path(pattern="^(approve|reject|retry|abort|cancel)$")],
) -> Response:
    """A step on the run as the signed-in person (the API's step, the role it needs)."""
    found, me, fields = await posted(request)
    require(me, project, ROLES[action])
    stack = StackRef(project, workspace)
    comment = fields.get("comment", "").strip()[:2000] or None
    done = await runs.take_step(ctx_of(request), stack, run_id, action, me, comment)
    run = f"{base_of(stack)}/runs/{run_id}"
    response = RedirectResponse(run, 303)
    flash = found.model_copy(update={"flash": done.result[:400]})
    session.write(request, response, flash, secret_of(request))
    return response


@router.get("/sets")
async def open_set(name: Annotated[str, Query(min_length=1, max_length=200)]) -> Response:
    """The home page's "open a set" form: to the set's page."""
    return RedirectResponse(f"/ui/sets/{quote(name, safe='')}", status_code=303)


@router.get("/sets/{name}")
async def set_page(request: Request, name: Annotated[str, Path(max_length=200)]) -> Response:
    """The set's latest run: its phase and wave, and each stack's phase, revision and counts
    (a viewer of every stack's project)."""
    _, view = await sets.set_run(
        ctx_of(request), signed_in(request)[1], name, "latest", Role.viewer, "reading a set run"
    )
    return render(request, "set.html", view=view, base_of=base_of)


@router.get("/s/{project}/{workspace}/releases")
async def release_list(
    request: Request, project: ProjectPath, workspace: WorkspacePath
) -> Response:
    viewer(request, project)
    stack = StackRef(project, workspace)
    found = await releases.list_releases(ctx_of(request), stack)
    return render(request, "releases.html", stack=stack, base=base_of(stack), releases=found)


@router.get("/s/{project}/{workspace}/releases/{revision}")
async def release_page(
    request: Request, project: ProjectPath, workspace: WorkspacePath, revision: Revision
) -> Response:
    viewer(request, project)
    stack = StackRef(project, workspace)
    release = await releases.one_release(ctx_of(request), stack, revision)
    return render(request, "release.html", stack=stack, base=base_of(stack), release=release)


@router.get("/s/{project}/{workspace}/diff")
async def release_diff(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    old: Annotated[int, Query(ge=1, le=10**9)],
    new: Annotated[int, Query(ge=1, le=10**9)],
) -> Response:
    viewer(request, project)
    stack = StackRef(project, workspace)
    diff = await releases.release_diff(ctx_of(request), stack, old, new)
    return render(request, "diff.html", stack=stack, base=base_of(stack), diff=diff)
