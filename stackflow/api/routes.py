"""The ``/v1`` routes: runs of a stack (start, status, preview, steer), its releases and
outputs, and the health checks."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from stackflow.api import events, hooks, models, releases, run_start, runs
from stackflow.api.context import ApiContext
from stackflow.api.hooks import HookResult
from stackflow.api.identity import Identity, Role
from stackflow.api.models import RunRequest, StepRequest
from stackflow.api.problems import PROBLEM_JSON, Problem, problem
from stackflow.client import types
from stackflow.core.refs import StackRef
from stackflow.model.notifications import (
    RESERVED_NAMES,
    TARGET_LIMIT,
    TARGET_NAME,
    Destination,
    NotificationTarget,
)
from stackflow.model.source import GitSource
from stackflow.policy_gate.bundle import PolicyBundle, fetch_bundle, store_bundle
from stackflow.temporal.operation import NAME_LIMIT, NAME_PATTERN, REVISION_LIMIT

router = APIRouter(prefix="/v1")

ProjectPath = Annotated[
    str, Path(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN, description="Project")
]
WorkspacePath = Annotated[
    str, Path(min_length=1, max_length=NAME_LIMIT, pattern=NAME_PATTERN, description="Workspace")
]
RunIdPath = Annotated[str, Path(min_length=1, max_length=64, description="Temporal run id")]
KeyHeader = Annotated[
    str | None,
    Header(alias="Idempotency-Key", description="Makes the call exactly-once (same key)."),
]
# An event stream's parameters (a run's, a set run's): where it resumes, whether it waits.
AfterSeq = Annotated[int | None, Query(ge=0, le=10**12, description="Resume after this seq")]
WaitForEvents = Annotated[bool, Query(description="Wait for events until run_complete")]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]
AcceptHeader = Annotated[str | None, Header()]
STACK = "/stacks/{project}/{workspace}"
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": text, "content": {PROBLEM_JSON: {}}}
    for code, text in {
        400: "Malformed request",
        401: "No or unknown token",
        403: "The token's role does not allow this",
        404: "Not found",
        409: "Busy stack, or the run is not in a state for this",
        413: "Body too large",
        422: "Invalid input",
        503: "Temporal or the state backend is unreachable",
    }.items()
}
HOOK_ANSWERS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    201: {"model": HookResult, "description": "Runs started"},
    202: {"model": HookResult, "description": "Nothing to start (each stack says why)"},
}


def ctx_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def needs(role: Role) -> Any:
    """A dependency: the caller (authenticated by the guard) holds ``role`` on the project."""

    def check(request: Request, project: ProjectPath) -> Identity:
        # the guard authenticates every /v1/stacks request first
        return require(getattr(request.state, "identity", None), project, role)

    return Depends(check)


def require(identity: Identity | None, project: str, role: Role) -> Identity:
    """``identity``, once it holds ``role`` on ``project`` (else 401 / 403 saying why)."""
    if identity is None:
        raise Problem(401, "a bearer token is required", "unauthorized")
    if not identity.allows(project, role):
        has = identity.role_for(project)
        raise Problem(
            403,
            f"{identity.name} is {has.name if has else 'no role'} on project {project}; "
            f"this needs {role.name}",
            "forbidden",
        )
    return identity


Viewer = Annotated[Identity, needs(Role.viewer)]
Operator = Annotated[Identity, needs(Role.operator)]
Approver = Annotated[Identity, needs(Role.approver)]


@router.post(
    STACK + "/runs",
    status_code=201,
    response_model=models.RunCreated,
    responses={
        **ERRORS,
        200: {"model": models.RunCreated, "description": "The Idempotency-Key's run"},
    },
)
async def start_run(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    body: RunRequest,
    who: Operator,
    idempotency_key: KeyHeader = None,
) -> JSONResponse:
    """Start a run (as `stackflow preview|apply|destroy|rollback|refresh|drift check`).
    `auto_approve`, and a spec with a resource that adopts (`extensions.adopt`) or imports
    (`extensions["kusionstack.io/import-id"]`) an existing object, need the approver role:
    an operator's is a 403 naming it, and nothing starts."""
    stack = StackRef(project, workspace)
    ctx = ctx_of(request)
    try:
        role = who.role_for(project) or Role.viewer  # (Operator: at least operator)
        started = await run_start.start_run(ctx, stack, body, who.name, idempotency_key, role=role)
    except Exception:
        ctx.metrics.run_refused(body.operation.value)
        raise
    ctx.metrics.run_started(body.operation.value, started.created)
    ctx.remember_run(stack, started.run_id, started.handle.id)
    created = types.RunCreated(
        run_id=started.run_id,
        workflow_id=started.handle.id,
        operation=body.operation,
        status_url=f"/v1/stacks/{project}/{workspace}/runs/{started.run_id}",
        events_url=f"/v1/stacks/{project}/{workspace}/runs/{started.run_id}/events",
    )
    return JSONResponse(
        types.to_json(created),
        status_code=201 if started.created else 200,
        headers={"Location": created.status_url},
    )


@router.get(STACK + "/runs", response_model=models.RunPage, responses=ERRORS)
async def list_runs(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    _: Viewer,
    page_size: Annotated[int, Query(ge=1, le=runs.PAGE_LIMIT)] = 20,
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> types.RunPage:
    """The stack's runs (running first, then newest first), a page at a time."""
    stack = StackRef(project, workspace)
    return await runs.list_runs(ctx_of(request), stack, page_size, page_token)


@router.get(STACK + "/runs/{run_id}", response_model=models.RunView, responses=ERRORS)
async def get_run(
    request: Request, project: ProjectPath, workspace: WorkspacePath, run_id: RunIdPath, _: Viewer
) -> types.RunView:
    """Phase and progress of a run (the `status` query), or how it ended."""
    ctx = ctx_of(request)
    stack = StackRef(project, workspace)
    handle, described = await runs.find_run(ctx, stack, run_id)
    described = await runs.closed_if_ending(ctx, stack, handle, described)
    return await runs.run_view(ctx, stack, handle, described)


@router.get(STACK + "/runs/{run_id}/preview", responses=ERRORS)
async def get_preview(
    request: Request, project: ProjectPath, workspace: WorkspacePath, run_id: RunIdPath, _: Viewer
) -> dict[str, Any]:
    """The run's preview, sensitive values masked (as `stackflow preview --output json`)."""
    ctx = ctx_of(request)
    handle, described = await runs.find_run(ctx, StackRef(project, workspace), run_id)
    return await runs.preview_of(ctx, handle, described)


@router.get(
    STACK + "/runs/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        **ERRORS,
        429: {
            "description": "The caller already has its most event streams open",
            "content": {PROBLEM_JSON: {}},
        },
        200: {
            "description": "The run's events, one per line (NDJSON) or per message (SSE), "
            "ending after run_complete",
            "content": {events.NDJSON: {}, events.SSE: {}},
        },
    },
)
async def run_events(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    run_id: RunIdPath,
    who: Viewer,
    after: AfterSeq = None,
    wait: WaitForEvents = True,
    last_event_id: LastEventId = None,
    accept: AcceptHeader = None,
) -> StreamingResponse:
    """The run's event stream (NDJSON, or SSE with `Accept: text/event-stream`): first a
    header line, then `{seq, type, time, ...}` events; resume with `?after=SEQ` or
    `Last-Event-ID`. A caller holds at most `STACKFLOW_API_MAX_STREAMS` streams open at
    once (429 past it)."""
    start = events.cursor(after, last_event_id)
    kind = events.media_type(accept)
    return await events.event_stream(
        ctx_of(request), StackRef(project, workspace), run_id, who, start, kind, wait
    )


StepBody = Annotated[StepRequest | None, Body()]
STEPS: tuple[tuple[str, Role, str], ...] = (
    (
        "approve",
        Role.approver,
        "Approve a run waiting in awaitingApproval (the approver recorded is the token's name).",
    ),
    ("reject", Role.approver, "Reject a run waiting in awaitingApproval (it ends failed)."),
    (
        "retry",
        Role.operator,
        "Re-run the failed nodes of a run paused on them (`on_failure: pause`).",
    ),
    ("abort", Role.operator, "End a paused run as failed, as it is."),
    (
        "cancel",
        Role.operator,
        "Cancel a running run; its release ends failed, saying so "
        "(cancelling twice is harmless: an Idempotency-Key changes nothing).",
    ),
)
"""The steps on a run: ``POST …/runs/{run_id}/<action>``, the role each needs, its doc."""


def _add_step(action: str, role: Role, doc: str) -> None:
    async def step(
        request: Request,
        project: ProjectPath,
        workspace: WorkspacePath,
        run_id: RunIdPath,
        who: Identity,
        body: StepBody = None,
        idempotency_key: KeyHeader = None,
    ) -> types.StepResult:
        comment = body.comment if body else None
        stack = StackRef(project, workspace)
        return await runs.take_step(
            ctx_of(request), stack, run_id, action, who, comment, idempotency_key
        )

    # the role is this route's: an annotation object, not a name the module could resolve
    step.__annotations__["who"] = Annotated[Identity, needs(role)]
    step.__name__ = step.__qualname__ = action
    step.__doc__ = doc
    router.add_api_route(
        STACK + "/runs/{run_id}/" + action,
        step,
        methods=["POST"],
        response_model=models.StepResult,
        responses=ERRORS,
        name=action,
    )


for _action, _role, _doc in STEPS:
    _add_step(_action, _role, _doc)


@router.get(STACK + "/releases", responses=ERRORS)
async def list_releases(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Viewer
) -> list[dict[str, Any]]:
    """The stack's releases, newest first (without spec and state)."""
    return await releases.list_releases(ctx_of(request), StackRef(project, workspace))


@router.get(STACK + "/releases/{revision}", responses=ERRORS)
async def get_release(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    revision: Annotated[int, Path(ge=1, le=REVISION_LIMIT)],
    _: Viewer,
) -> dict[str, Any]:
    """One release with its spec and recorded state, sensitive values masked."""
    return await releases.one_release(ctx_of(request), StackRef(project, workspace), revision)


Revision = Annotated[int, Path(ge=1, le=REVISION_LIMIT)]


@router.get(STACK + "/releases/{old}/diff/{new}", responses=ERRORS)
async def diff_releases(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    old: Revision,
    new: Revision,
    _: Viewer,
) -> dict[str, Any]:
    """What changed between two releases, masked (as `stackflow release diff --output json`)."""
    return await releases.release_diff(ctx_of(request), StackRef(project, workspace), old, new)


@router.get(STACK + "/outputs", responses=ERRORS)
async def get_outputs(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Viewer
) -> dict[str, Any]:
    """The latest release's recorded attributes per resource, sensitive values masked."""
    return await releases.outputs(ctx_of(request), StackRef(project, workspace))


@router.put(STACK + "/source", response_model=models.SourceView, responses=ERRORS)
async def bind_source(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    body: GitSource,
    who: Approver,
) -> types.SourceView:
    """Bind the stack to a spec file in a git repository: pushes to `ref` signed with
    `secret` (POST /v1/hooks/github) start runs of the pushed commit, an apply or a preview
    as `on_push` says (`mode`, its former name, is accepted too); a run may also name a
    `commit` instead of a spec. The secret is stored sealed and never served."""
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    await ctx.state(lambda: ctx.backend.bind_source(stack, body, by=who.name))
    return types.parse(types.SourceView, body.public())


@router.get(STACK + "/source", response_model=models.SourceView, responses=ERRORS)
async def get_source(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Viewer
) -> types.SourceView:
    """The stack's git source (without its secret)."""
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    bound = await ctx.state(lambda: ctx.backend.source_of(stack))
    if bound is None:
        raise Problem(404, f"stack {stack} has no git source", "not-found")
    return types.parse(types.SourceView, bound.public())


@router.delete(STACK + "/source", status_code=204, responses=ERRORS)
async def unbind_source(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Approver
) -> None:
    """Unbind the stack from its git source (pushes start nothing any more)."""
    ctx, stack = ctx_of(request), StackRef(project, workspace)
    if not await ctx.state(lambda: ctx.backend.unbind_source(stack)):
        raise Problem(404, f"stack {stack} has no git source", "not-found")


@router.post(
    "/hooks/github",
    response_model=HookResult,
    responses=HOOK_ANSWERS,
)
async def github_hook(
    request: Request,
    x_github_event: Annotated[str | None, Header()] = None,
    x_github_delivery: Annotated[str | None, Header()] = None,
    x_hub_signature_256: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """GitHub's push event (content type application/json): a push to a bound branch
    starts that stack's run of the pushed commit, once however often it is delivered."""
    status, result = await hooks.github_push(
        ctx_of(request),
        await request.body(),
        event=x_github_event,
        delivery=x_github_delivery,
        signature=x_hub_signature_256,
    )
    return JSONResponse(result.model_dump(mode="json"), status_code=status)


PROJECT = "/projects/{project}"


class NotificationTargets(BaseModel):
    """``PUT /v1/projects/{project}/notifications``."""

    model_config = ConfigDict(extra="forbid")

    targets: list[NotificationTarget] = Field(max_length=TARGET_LIMIT)


@router.put(PROJECT + "/notifications", responses=ERRORS)
async def set_notifications(
    request: Request, project: ProjectPath, body: NotificationTargets, _: Approver
) -> list[dict[str, Any]]:
    """Replace the project's webhook destinations: each gets every run's transitions it
    subscribes to as a CloudEvent, signed `X-Stackflow-Signature: sha256=<HMAC of the body>`
    with its secret (stored sealed, never served)."""
    names = [t.name for t in body.targets]
    if len(set(names)) != len(names):
        raise Problem(422, "targets: each destination needs a name of its own", "invalid-input")
    ctx = ctx_of(request)
    await ctx.state(lambda: ctx.backend.set_notification_targets(project, body.targets))
    return [t.public() for t in body.targets]


@router.get(PROJECT + "/notifications", responses=ERRORS)
async def get_notifications(
    request: Request, project: ProjectPath, _: Viewer
) -> list[dict[str, Any]]:
    """The project's webhook destinations (without secrets)."""
    ctx = ctx_of(request)
    targets = await ctx.state(lambda: ctx.backend.notification_targets(project))
    return [t.public() for t in targets]


@router.get(PROJECT + "/notifications/failed", responses=ERRORS)
async def failed_notifications(
    request: Request,
    project: ProjectPath,
    _: Viewer,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Deliveries that did not succeed within their retries (the dead-letter list), newest
    first."""
    ctx = ctx_of(request)
    failures = await ctx.state(lambda: ctx.backend.notification_failures(project, limit))
    return [f.model_dump(mode="json") for f in failures]


DestinationPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=100,
        pattern=TARGET_NAME,
        description="Destination name (not `failed`)",
    ),
]


@router.put(
    PROJECT + "/notifications/{name}",
    response_model=models.NotificationTargetView,
    responses=ERRORS,
)
async def set_notification(
    request: Request, project: ProjectPath, name: DestinationPath, body: Destination, _: Approver
) -> types.NotificationTargetView:
    """Add the webhook destination `name` after the project's others, or replace the one of
    that name in its place (the whole list: `PUT …/notifications`); its secret is stored
    sealed, never served."""
    if name in RESERVED_NAMES:
        raise Problem(
            422,
            f"name: {name!r} is reserved (…/notifications/{name} is the dead-letter list)",
            "invalid-input",
        )
    target = body.named(name)
    ctx = ctx_of(request)
    await ctx.state(lambda: ctx.backend.put_notification_target(project, target))
    return types.parse(types.NotificationTargetView, target.public())


@router.get(
    PROJECT + "/notifications/{name}",
    response_model=models.NotificationTargetView,
    responses=ERRORS,
)
async def get_notification(
    request: Request, project: ProjectPath, name: DestinationPath, _: Viewer
) -> types.NotificationTargetView:
    """One webhook destination of the project (without its secret)."""
    ctx = ctx_of(request)
    targets = await ctx.state(lambda: ctx.backend.notification_targets(project))
    for target in targets:
        if target.name == name:
            return types.parse(types.NotificationTargetView, target.public())
    raise Problem(404, f"project {project} has no notification destination {name}", "not-found")


@router.delete(PROJECT + "/notifications/{name}", status_code=204, responses=ERRORS)
async def remove_notification(
    request: Request, project: ProjectPath, name: DestinationPath, _: Approver
) -> None:
    """Remove the project's webhook destination `name` (its failed deliveries stay listed)."""
    ctx = ctx_of(request)
    if not await ctx.state(lambda: ctx.backend.remove_notification_target(project, name)):
        raise Problem(404, f"project {project} has no notification destination {name}", "not-found")


@router.post(
    "/hooks/generic",
    response_model=HookResult,
    responses=HOOK_ANSWERS,
)
async def generic_hook(
    request: Request,
    x_stackflow_signature: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """A CloudEvents 1.0 JSON event of a push (`data: {repository, ref, commit, changed}`),
    signed `X-Stackflow-Signature: sha256=<HMAC-SHA256 of the body>` with the binding's
    secret: as a GitHub push."""
    status, result = await hooks.cloudevent_push(
        ctx_of(request), await request.body(), signature=x_stackflow_signature
    )
    return JSONResponse(result.model_dump(mode="json"), status_code=status)


@router.put(PROJECT + "/policy", response_model=models.PolicyView, responses=ERRORS)
async def push_policy(
    request: Request, project: ProjectPath, body: PolicyBundle, who: Approver
) -> types.PolicyView:
    """Store the project's policy bundle (Rego modules in `package stackflow`; content-
    addressed): every later preview, apply, destroy and rollback of the project evaluates
    it between preview and approval (`stackflow policy push`)."""
    ctx = ctx_of(request)

    def push() -> str:
        digest = store_bundle(ctx.backend, body)
        ctx.backend.bind_policy(project, digest, by=who.name)
        return digest

    digest = await ctx.state(push)
    return types.PolicyView(project=project, digest=digest, modules=sorted(body.modules))


@router.get(PROJECT + "/policy", response_model=models.PolicyView, responses=ERRORS)
async def get_policy(request: Request, project: ProjectPath, _: Viewer) -> types.PolicyView:
    """The project's policy bundle: its digest, who pushed it, its modules."""
    ctx = ctx_of(request)

    def read() -> types.PolicyView | None:
        bound = ctx.backend.policy_of(project)
        if bound is None:
            return None
        modules = sorted(fetch_bundle(ctx.backend, bound.digest).modules)
        return types.PolicyView(**bound.model_dump(), modules=modules)

    found = await ctx.state(read)
    if found is None:
        raise Problem(404, f"project {project} has no policy bundle", "not-found")
    return found


@router.delete(PROJECT + "/policy", status_code=204, responses=ERRORS)
async def remove_policy(request: Request, project: ProjectPath, _: Approver) -> None:
    """Remove the project's policy bundle (later runs evaluate no project policy)."""
    ctx = ctx_of(request)
    if not await ctx.state(lambda: ctx.backend.unbind_policy(project)):
        raise Problem(404, f"project {project} has no policy bundle", "not-found")


@router.get("/healthz", response_model=models.Health)
async def healthz() -> types.Health:
    """The process answers (no dependency checked)."""
    return types.Health(status="ok")


@router.get("/readyz", response_model=models.Health, responses={503: ERRORS[503]})
async def readyz(request: Request) -> Any:
    """Temporal and the state backend answer."""
    ctx = ctx_of(request)
    checks: dict[str, str] = {}
    try:
        client = await ctx.client()
        await client.workflow_service.get_system_info(
            GetSystemInfoRequest(), retry=False, timeout=timedelta(seconds=3)
        )
        checks["temporal"] = "ok"
    except Exception as exc:
        checks["temporal"] = f"unreachable: {' '.join(str(exc).split())[:200]}"
    try:
        await ctx.state(ctx.backend.check_schema)
        checks["state_backend"] = "ok"
    except Exception as exc:
        checks["state_backend"] = f"unreachable: {' '.join(str(exc).split())[:200]}"
    if all(v == "ok" for v in checks.values()):
        return types.Health(status="ok", checks=checks)
    detail = "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return problem(503, detail, "not-ready", checks=checks)
