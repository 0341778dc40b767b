"""A stack's drift checks on a schedule and its last drift report: ``stackflow drift
schedule|unschedule|status``. The
schedule is a Temporal Schedule (:mod:`stackflow.temporal.schedules`, the one the CLI makes),
starting ``DriftWorkflow`` on this server's task queue."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from temporalio.service import RPCError, RPCStatusCode

from stackflow.api.identity import Role
from stackflow.api.models import (
    DriftScheduleRequest,
    DriftScheduleView,
    DriftStatus,
    RunOperation,
    RunRequest,
)
from stackflow.api.routes import ERRORS, STACK, Operator, ProjectPath, Viewer, WorkspacePath, ctx_of
from stackflow.api.runs import check_role
from stackflow.core.errors import NotFoundError, SpecError, StackflowError
from stackflow.core.refs import StackRef
from stackflow.model.drift import parse_every, schedule_id
from stackflow.temporal.operation import DriftInput
from stackflow.temporal.schedules import put_drift_schedule

router = APIRouter(prefix="/v1")


@router.put(
    STACK + "/drift/schedule",
    response_model=DriftScheduleView,
    status_code=201,
    responses={**ERRORS, 200: {"model": DriftScheduleView, "description": "Replaced"}},
)
async def schedule_drift(
    request: Request,
    project: ProjectPath,
    workspace: WorkspacePath,
    body: DriftScheduleRequest,
    who: Operator,
) -> JSONResponse:
    """Check the stack for drift every `every` on a Temporal Schedule, replacing its schedule
    if it has one (201 created, 200 replaced), as `stackflow drift schedule`. Each check's
    repair (`repair`) is requested by the caller; `auto_approve` needs the approver role."""
    stack = StackRef(project, workspace)
    every = parse_every(body.every, "every")
    role = who.role_for(project) or Role.viewer
    asked = RunRequest(
        operation=RunOperation.drift, repair=body.repair, auto_approve=body.auto_approve
    )
    check_role(stack, asked, None, who.name, role)  # auto_approve: an approver's (403)
    try:
        drift = DriftInput(
            project=project,
            workspace=workspace,
            repair=body.repair,
            auto_approve=body.auto_approve,
            requested_by=who.name,
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {str(exc).splitlines()[-1].strip()}") from None
    ctx = ctx_of(request)
    client = await ctx.client()
    sid, created = await put_drift_schedule(client, drift, every, ctx.task_queue)
    view = DriftScheduleView(
        schedule_id=sid,
        project=project,
        workspace=workspace,
        every=body.every.strip(),
        every_seconds=int(every.total_seconds()),
        repair=body.repair,
        auto_approve=body.auto_approve,
        requested_by=who.name,
        created=created,
    )
    return JSONResponse(view.model_dump(mode="json"), status_code=201 if created else 200)


@router.delete(STACK + "/drift/schedule", status_code=204, responses=ERRORS)
async def unschedule_drift(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Operator
) -> None:
    """Delete the stack's drift schedule (404 when it has none), as `stackflow drift
    unschedule`."""
    stack = StackRef(project, workspace)
    sid = schedule_id(stack)
    client = await ctx_of(request).client()
    try:
        await client.get_schedule_handle(sid).delete()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NotFoundError(f"{stack} has no drift schedule ({sid})") from None
        raise


@router.get(STACK + "/drift", response_model=DriftStatus, responses=ERRORS)
async def drift_status(
    request: Request, project: ProjectPath, workspace: WorkspacePath, _: Viewer
) -> DriftStatus:
    """The stack's last drift report with the drifted resources' masked diffs (404 before
    its first check), as `stackflow drift status --output json`."""
    stack = StackRef(project, workspace)
    ctx = ctx_of(request)

    def read() -> DriftStatus:
        reports = ctx.backend.drift_reports(stack, limit=1)
        if not reports:
            raise NotFoundError(f"{stack} has no drift report yet; run `stackflow drift check`")
        report = reports[0]
        rows: list[dict[str, Any]] = []
        if report.report_ref is not None:
            try:  # as the CLI directly: a report whose diffs cannot be read has none
                rows = json.loads(ctx.backend.get_blob("drift_report", report.report_ref))
            except StackflowError:
                rows = []
        return DriftStatus(**report.model_dump(), drifted_resources=rows)

    return await ctx.state(read)
