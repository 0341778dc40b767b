"""``POST /v1/sets/{name}/runs`` and ``GET /v1/sets/{name}/runs/{run_id}``: a stack set's
run through the API, as ``stackflow set preview|apply|destroy`` and ``stackflow set status``
start and read it. The caller must be an operator of every member's project (an approver of
every one for ``auto_approve``), a viewer of every one to read the run; the set is checked
whole (references, order) before anything starts: one line, problem+json 422."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from stackflow.api import events, models
from stackflow.api.context import ApiContext
from stackflow.api.identity import Identity, Role
from stackflow.api.problems import Problem
from stackflow.api.routes import (
    ERRORS,
    AcceptHeader,
    AfterSeq,
    LastEventId,
    RunIdPath,
    WaitForEvents,
    ctx_of,
)
from stackflow.api.runs import STEP_TIMEOUT
from stackflow.api.set_events import SetRelay, newest_run, set_stack
from stackflow.api.set_start import SetRunCreated, launch_set
from stackflow.client.types import SourceView, parse
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.spec import parse_spec
from stackflow.model.source import GitSource, SourceRef
from stackflow.model.stack_set import MEMBER_LIMIT, NAME, Strategy
from stackflow.temporal.client import TemporalUnreachable
from stackflow.temporal.operation import NAME_LIMIT, NAME_PATTERN
from stackflow.temporal.stack_set import Member, SetOperation, SetView, set_workflow_id

router = APIRouter(prefix="/v1")
SetPath = Annotated[str, Path(min_length=1, max_length=200, pattern=NAME, description="Set")]


class SetMemberBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN)
    workspace: str = Field(
        default="default", min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN
    )
    spec: dict[str, Any] | None = None
    """The member's Kusion v1 spec (preview, apply)."""
    source: SourceRef | None = None
    """Or its spec file at a git commit (``{url, commit, path}``)."""
    depends_on: list[str] = Field(default_factory=list, max_length=MEMBER_LIMIT)
    context: dict[str, Any] = Field(default_factory=dict)
    """Merged over the spec's ``context`` (this target's kube context, provider env)."""


class SetRunRequest(BaseModel):
    """``POST /v1/sets/{name}/runs``: the set file's stacks with their specs inline."""

    model_config = ConfigDict(extra="forbid")

    operation: SetOperation
    members: list[SetMemberBody] = Field(min_length=1, max_length=MEMBER_LIMIT)
    auto_approve: bool = False
    on_failure: Literal["halt", "rollback", "pause"] = "halt"
    max_parallel: int = Field(default=4, ge=1, le=50)
    strategy: Strategy | None = None
    """An apply as a rollout: ordered waves, bake times, an error budget (as a set file's)."""


def _caller(request: Request) -> Identity:
    identity: Identity | None = getattr(request.state, "identity", None)
    if identity is None:
        raise Problem(401, "a bearer token is required", "unauthorized")
    return identity


def _check_roles(who: Identity, projects: list[str], role: Role, why: str) -> None:
    """The caller holds ``role`` on every member's project: a 403 naming the first not."""
    for project in dict.fromkeys(projects):
        if not who.allows(project, role):
            has = who.role_for(project)
            raise Problem(
                403,
                f"{who.name} is {has.name if has else 'no role'} on project {project}; "
                f"{why} needs {role.name} on every stack's project",
                "forbidden",
            )


@router.post(
    "/sets/{name}/runs",
    status_code=201,
    response_model=SetRunCreated,
    responses=ERRORS,
)
async def start_set_run(request: Request, name: SetPath, body: SetRunRequest) -> JSONResponse:
    """Start a set run (as `stackflow set preview|apply|destroy`)."""
    who = _caller(request)
    projects = [m.project for m in body.members]
    _check_roles(who, projects, Role.operator, f"a set {body.operation}")
    if body.auto_approve:
        _check_roles(who, projects, Role.approver, "auto_approve")
    ctx = ctx_of(request)
    members = [
        Member(
            StackRef(m.project, m.workspace),
            m.depends_on,
            None if m.spec is None else parse_spec(m.spec, f"{m.project}/{m.workspace}: spec"),
            m.source,
            m.context,
        )
        for m in body.members
    ]
    options = body.model_dump(include={"auto_approve", "on_failure", "max_parallel"})
    created = await launch_set(
        ctx,
        name,
        body.operation,
        members,
        body.strategy,
        operator=who.name,
        summary=f"by {who.name} through the API",
        **options,
    )
    return JSONResponse(
        created.model_dump(), status_code=201, headers={"Location": created.status_url}
    )


@router.put("/sets/{name}/source", response_model=models.SourceView, responses=ERRORS)
async def bind_set_source(request: Request, name: SetPath, body: GitSource) -> SourceView:
    """Bind the set to a set file in a git repository (`path`): pushes to `ref` signed with
    `secret` (POST /v1/hooks/github or /v1/hooks/generic) start one set run (apply or
    preview, per `on_push`) of the file at the pushed commit. Needs the approver role on
    every project (a `*` glob): a push may name any stack in the set file."""
    who = _caller(request)
    _check_roles(who, [set_stack(name).project], Role.approver, "binding a set to git")
    ctx = ctx_of(request)
    await ctx.state(lambda: ctx.backend.bind_source(set_stack(name), body, by=who.name))
    return parse(SourceView, body.public())


@router.get("/sets/{name}/source", response_model=models.SourceView, responses=ERRORS)
async def get_set_source(request: Request, name: SetPath) -> SourceView:
    """The set's git source (without its secret)."""
    _check_roles(_caller(request), [set_stack(name).project], Role.viewer, "reading it")
    ctx = ctx_of(request)
    bound = await ctx.state(lambda: ctx.backend.source_of(set_stack(name)))
    if bound is None:
        raise Problem(404, f"set {name} has no git source", "not-found")
    return parse(SourceView, bound.public())


@router.delete("/sets/{name}/source", status_code=204, responses=ERRORS)
async def unbind_set_source(request: Request, name: SetPath) -> None:
    """Unbind the set from its git source (pushes start nothing any more)."""
    who = _caller(request)
    _check_roles(who, [set_stack(name).project], Role.approver, "unbinding a set from git")
    ctx = ctx_of(request)
    if not await ctx.state(lambda: ctx.backend.unbind_source(set_stack(name))):
        raise Problem(404, f"set {name} has no git source", "not-found")


async def _run(
    request: Request, name: str, run_id: str, role: Role, why: str
) -> tuple[Any, SetView]:
    return await set_run(ctx_of(request), _caller(request), name, run_id, role, why)


async def set_run(
    ctx: ApiContext, who: Identity, name: str, run_id: str, role: Role, why: str
) -> tuple[Any, SetView]:
    """The set run's handle and status, once ``who`` holds ``role`` on every member (the
    API's routes and the web UI's set page)."""
    client = await ctx.client()
    latest = run_id == "latest"  # the set's latest run
    handle = client.get_workflow_handle(set_workflow_id(name), run_id=None if latest else run_id)
    try:
        if not latest:  # the run it continued as new as, if it did: where it is now
            handle = await newest_run(client, handle)
        view = await handle.query("status", result_type=SetView)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise Problem(404, f"set {name} has no run {run_id}", "not-found") from None
        raise
    _check_roles(who, [m.project for m in view.members], role, why)
    return handle, view


@router.get("/sets/{name}/runs/{run_id}", response_model=SetView, responses=ERRORS)
async def get_set_run(request: Request, name: SetPath, run_id: RunIdPath) -> JSONResponse:
    """The set run's status: per stack its phase, revision, counts and error (``run_id``
    ``latest``: the set's latest run)."""
    _, view = await _run(request, name, run_id, Role.viewer, "reading a set run")
    return JSONResponse(view.model_dump(mode="json"))


@router.post("/sets/{name}/runs/{run_id}/{step}", responses=ERRORS)
async def steer_set_run(
    request: Request,
    name: SetPath,
    run_id: RunIdPath,
    step: Literal["approve", "reject", "retry", "abort", "cancel"],
) -> JSONResponse:
    """Approve or reject the set run's approval (or a wave's gate): an approver of every
    member's project, on a four-eyes project not the set's requester (409); retry or abort
    a paused set, or cancel a set run: an operator of every one. ``run_id`` ``latest``: the
    set's latest run."""
    role = Role.approver if step in ("approve", "reject") else Role.operator
    handle, _ = await _run(request, name, run_id, role, f"to {step} a set run")
    try:
        if step == "cancel":
            await handle.cancel()
            said = f"cancel requested for set {name}"
        else:
            update = handle.execute_update(step, {"by": _caller(request).name}, result_type=str)
            said = await asyncio.wait_for(update, STEP_TIMEOUT.total_seconds())
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        raise Problem(
            409,
            f"set {name}: no running run to {step} (its latest run ended, or it never ran)",
            "refused",
        ) from None
    except TimeoutError:
        raise TemporalUnreachable(
            f"{step} not answered within {int(STEP_TIMEOUT.total_seconds())} s: no worker is "
            "taking this set run's tasks (is one running?)"
        ) from None
    except WorkflowUpdateFailedError as exc:
        message = getattr(exc.cause, "message", str(exc.cause))
        raise Problem(409, f"set {name}: {message}", "refused") from None
    return JSONResponse({"run_id": run_id, "step": step, "result": said})


@router.get(
    "/sets/{name}/runs/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        **ERRORS,
        200: {
            "description": "Every stack's events of the set run, one per line (NDJSON) or per "
            "message (SSE), each naming its `stack` and `run_id`; ends after run_complete",
            "content": {events.NDJSON: {}, events.SSE: {}},
        },
    },
)
async def set_run_events(
    request: Request,
    name: SetPath,
    run_id: RunIdPath,
    after: AfterSeq = None,
    wait: WaitForEvents = True,
    last_event_id: LastEventId = None,
    accept: AcceptHeader = None,
) -> StreamingResponse:
    """The set run's one event stream, as a run's (`?after=SEQ`, `Last-Event-ID`, SSE with
    `Accept: text/event-stream`): each member run's events with its `stack` and `run_id` (a
    member run's end is `stack_complete`), numbered in the set run's own order; a viewer of
    every member. `run_id` `latest`: the set's latest run."""
    ctx, who = ctx_of(request), _caller(request)
    start, kind = events.cursor(after, last_event_id), events.media_type(accept)
    handle, view = await set_run(ctx, who, name, run_id, Role.viewer, "reading a set run")
    if run_id == "latest":  # keyed by its chain's first run, as its status_url names it
        described = await handle.describe()
        run_id = described.raw_description.workflow_execution_info.first_run_id
        handle = (await ctx.client()).get_workflow_handle(handle.id, run_id=described.run_id)
    run = RunRef(set_workflow_id(name), run_id or handle.run_id)
    relay = SetRelay(ctx.backend, name, handle, await ctx.client(), run)
    relay.watch(view)
    body = events.stream(
        ctx, set_stack(name), run, after=start, kind=kind, wait=wait, log=relay, closed=relay.closed
    )
    return events.slot_stream(ctx, who, kind, body)
