"""Freeing a stack by hand and moving release histories in and out: ``stackflow release
unlock|import|export``. Unlocking and
importing write history that no run wrote, so they are an approver's; an export is masked
as every release the API serves."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request

from stackflow.api.context import ApiContext
from stackflow.api.models import (
    ReleaseExport,
    ReleaseImport,
    ReleaseImported,
    StackExport,
    UnlockRequest,
)
from stackflow.api.problems import Problem
from stackflow.api.routes import (
    ERRORS,
    PROJECT,
    STACK,
    Approver,
    ProjectPath,
    Viewer,
    WorkspacePath,
    ctx_of,
)
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Unlocked
from stackflow.state.kusion import check_import, import_stacks, kusion_documents, selected_stacks
from stackflow.temporal.operation import NAME_LIMIT, NAME_PATTERN
from stackflow.temporal.runs import run_ended, unlock_by_hand

router = APIRouter(prefix="/v1")

UnlockBody = Annotated[UnlockRequest | None, Body()]


async def holder_ended(ctx: ApiContext, holder: RunRef) -> str | None:
    """How the run holding a stack ended, as Temporal says; None while it is open."""
    return await run_ended(await ctx.client(), holder)


@router.post(STACK + "/unlock", response_model=Unlocked, responses=ERRORS)
async def unlock(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    who: Approver,
    body: UnlockBody = None,
) -> Unlocked:
    """Free a stack whose run ended without releasing it: its release becomes failed, saying
    who unlocked it, as `stackflow release unlock`. A 409 (`stack-locked`, naming the run)
    while the holding run is still open in Temporal, unless `force`; `unlocked` is false
    when the stack was not locked. The next run recovers such a stack by itself, so this is
    rarely needed."""
    ctx, stack = ctx_of(request), StackRef(project, workspace)

    async def ended(holder: RunRef) -> str | None:
        return await holder_ended(ctx, holder)

    force = body.force if body else False
    return await unlock_by_hand(ctx.backend, stack, ended, force=force, by=who.name)


@router.post(
    PROJECT + "/releases/import", status_code=201, response_model=ReleaseImported, responses=ERRORS
)
async def import_releases(
    request: Request, project: ProjectPath, body: ReleaseImport, who: Approver
) -> ReleaseImported:
    """Import a release history into the project's stacks (`stackflow release import` reads
    Kusion's files and sends them here): every release is checked first and nothing is
    written if any of its stacks already has releases (409)."""
    others = sorted({r.project for r in body.releases if r.project != project})
    if others:
        raise Problem(
            422,
            f"releases: release of project {others[0]} in an import into project {project}",
            "invalid-input",
        )
    stacks = check_import(body.releases)
    ctx = ctx_of(request)
    imported = await ctx.state(lambda: import_stacks(stacks, ctx.backend))
    return ReleaseImported(project=project, imported=imported)


WorkspaceQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=NAME_LIMIT,
        pattern=NAME_PATTERN,
        description="Only this workspace",
    ),
]


@router.get(PROJECT + "/releases/export", response_model=ReleaseExport, responses=ERRORS)
async def export_releases(
    request: Request, project: ProjectPath, _: Viewer, workspace: WorkspaceQuery = None
) -> ReleaseExport:
    """The project's stacks' releases (or one workspace's) in Kusion's file form, sensitive
    values masked: what `stackflow release export` writes as `<n>.yaml` files."""
    ctx = ctx_of(request)

    def read() -> ReleaseExport:
        stacks = selected_stacks(ctx.backend, project, workspace)
        return ReleaseExport(
            stacks=[
                StackExport(
                    project=s.project,
                    workspace=s.workspace,
                    releases=kusion_documents(ctx.backend, s),
                )
                for s in stacks
            ]
        )

    return await ctx.state(read)
