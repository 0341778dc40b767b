"""Runs through the API: the workflow input a start sends (checked by the same code as the
CLI's; the start itself: :mod:`stackflow.api.run_start`), find a run by its Temporal run id,
read its status and preview, and steer it with the same Updates.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from stackflow.api.context import ApiContext
from stackflow.api.identity import Identity, Role
from stackflow.api.models import TAKES, WORKFLOWS, RunOperation, RunRequest
from stackflow.api.problems import Problem
from stackflow.client.errors import NOT_AWAITING_APPROVAL as NOT_AWAITING
from stackflow.client.types import RunPage, RunSummary, RunView, StepResult
from stackflow.core.errors import NotFoundError, OperationFailed, SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.budget import BUDGET
from stackflow.engine.spec import parse_spec, parse_spec_text
from stackflow.engine.takeover import taking_over
from stackflow.model.events import EventType
from stackflow.model.release import Phase
from stackflow.model.source import SourceRef
from stackflow.model.spec import Spec
from stackflow.policy_gate.bundle import store_bundle
from stackflow.temporal.client import TemporalUnreachable, is_unreachable
from stackflow.temporal.operation import (
    NOT_AWAITING_APPROVAL,
    ApprovalInput,
    DriftInput,
    DriftResult,
    OperationInput,
    OperationResult,
    StatusView,
    check_request,
    drift_workflow_id,
    preview_workflow_id,
    workflow_id_for,
)

IDEMPOTENCY_MEMO = "stackflow-idempotency"
REQUESTED_BY_MEMO = "stackflow-requested-by"
MESSAGE_MEMO = "stackflow-message"
IDEMPOTENCY_WINDOW = timedelta(hours=24)
QUERY_TIMEOUT = timedelta(seconds=10)
RUNNING = WorkflowExecutionStatus.RUNNING
CLOSING_WAIT = 2.0
"""How long a ``GET`` of a run whose stream has ended waits for its workflow to close."""
STEP_TIMEOUT = timedelta(seconds=30)
"""How long a step (an Update) may wait for a worker to take it: an HTTP call never hangs."""
KEY_LIMIT = 255


def workflow_id_of(stack: StackRef, operation: RunOperation) -> str:
    """The stack's id for the operation, as the CLI starts it."""
    if operation == RunOperation.preview:
        return preview_workflow_id(stack)
    if operation == RunOperation.drift:
        return drift_workflow_id(stack)
    return workflow_id_for(stack)


def candidate_ids(stack: StackRef) -> list[str]:
    """Every workflow id a run of the stack can have."""
    return [workflow_id_for(stack), preview_workflow_id(stack), drift_workflow_id(stack)]


def check_fields(body: RunRequest) -> None:
    """Refuse a field the operation does not take (as the CLI has no such option), and a
    missing one it needs."""
    takes = TAKES[body.operation] | {"operation", "message"}
    for name in sorted(body.model_fields_set - takes):
        raise SpecError(f"{name}: not taken by {body.operation}")
    given = [name for name in ("spec", "spec_yaml", "commit") if getattr(body, name) is not None]
    if len(given) > 1:
        raise SpecError(f"{', '.join(given)}: give one of them, not more")
    if {"spec", "spec_yaml"} <= TAKES[body.operation] and not given:
        raise SpecError(
            f"spec: {body.operation} needs a spec (spec or spec_yaml), or the commit of the "
            "stack's git source"
        )
    if body.operation == RunOperation.rollback and body.to_revision is None:
        raise SpecError("to_revision: rollback needs the release whose spec to apply again")


def parse_body_spec(body: RunRequest) -> Spec | None:
    if body.spec is not None:
        return parse_spec(body.spec, "spec")
    if body.spec_yaml is not None:
        return parse_spec_text(body.spec_yaml, "spec_yaml")
    return None


PAYLOAD_SLACK = 4096
"""Bytes a payload may take besides its JSON (metadata, the encryption's nonce and tag)."""


async def spec_fields(ctx: ApiContext, spec: Spec | None) -> dict[str, Any]:
    """How the workflow input carries the spec: inline when its JSON is within the byte
    budget, or else stored first and passed as ``spec_ref``. Its JSON, not its compressed
    payload, is what counts: the workflow and its first activity each decode the input
    whole, so a repetitive spec that compresses under the budget would still cost the worker
    ten times its JSON in memory (about 100 MB for 20,000 ConfigMaps)."""
    if spec is None:
        return {}
    data = spec.model_dump(mode="json", by_alias=True)
    if len(json.dumps(data)) + PAYLOAD_SLACK > BUDGET:
        return {"spec_ref": await ctx.state(lambda: ctx.backend.put_spec(spec))}
    return {"spec": data}


def option_error(exc: ValueError, flags: bool = False) -> str:
    """``field: message`` of a workflow input the model refused (``flags``: the field named
    as the CLI's option, ``--max-concurrency``)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        name = ".".join(str(p) for p in first["loc"]) or "input"
        if flags:
            name = "--" + name.replace("_", "-").removesuffix("-seconds")
        return f"{name}: {first['msg']}"
    return str(exc).splitlines()[-1].strip()


async def source_at(ctx: ApiContext, stack: StackRef, commit: str) -> SourceRef:
    """The stack's git source at ``commit``; SpecError when the stack has none."""
    bound = await ctx.state(lambda: ctx.backend.source_of(stack))
    if bound is None:
        raise SpecError(
            f"commit: stack {stack} has no git source; bind one with PUT "
            f"/v1/stacks/{stack.project}/{stack.workspace}/source"
        )
    return SourceRef(url=bound.url, commit=commit, path=bound.path)


def check_role(stack: StackRef, body: RunRequest, spec: Spec | None, by: str, role: Role) -> None:
    """Refuse (403, nothing started or stored) what only an approver may ask of a run: to be
    approved up front (``auto_approve``, also a drift check's repair), and to apply a spec
    that takes over objects stackflow did not make (:mod:`stackflow.engine.takeover`; a preview of
    one is an operator's, for an approver to look at). The spec of a run of a git
    ``commit`` is not read here (the worker fetches it): an operator's cannot be approved up
    front, and one that takes over objects waits for an approver whatever its
    ``auto_approve`` (:mod:`stackflow.workflows.gate`)."""
    if role >= Role.approver:
        return
    who = f"{by} is {role.name} on project {stack.project}"
    if body.auto_approve:
        raise Problem(
            403,
            f"auto_approve: {who}; approving a run up front needs approver (start it without "
            "auto_approve: it waits for an approver's approve)",
            "forbidden",
        )
    for name in ("force", "adopt"):
        if getattr(body, name) and body.operation != RunOperation.preview:
            raise Problem(
                403,
                f"{name}: {who}; taking over objects or fields stackflow does not own needs "
                "approver (an approver starts this run)",
                "forbidden",
            )
    applied = spec is not None and body.operation != RunOperation.preview
    found = taking_over(spec.resources) if spec is not None and applied else []
    if found:
        rid, how = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise Problem(
            403,
            f"resource {rid} {how}{more}: {who}; taking over objects stackflow did not make "
            "needs approver (an approver starts this run)",
            "forbidden",
            resource=rid,
        )


async def workflow_input(
    ctx: ApiContext, stack: StackRef, body: RunRequest, by: str, role: Role
) -> OperationInput | DriftInput:
    """The run's workflow input, once ``by`` (of ``role`` on the project) may ask for it."""
    check_fields(body)
    try:
        if body.operation == RunOperation.drift:
            check_role(stack, body, None, by, role)
            return DriftInput(
                project=stack.project,
                workspace=stack.workspace,
                repair=body.repair,
                auto_approve=body.auto_approve,
                requested_by=by,
            )
        spec = parse_body_spec(body)
        check_role(stack, body, spec, by, role)
        taken = TAKES[body.operation] - {"spec", "spec_yaml", "commit", "policy"}
        fields = body.model_dump(include=set(taken))
        if body.commit is not None:
            fields["source"] = await source_at(ctx, stack, body.commit)
        if body.policy is not None:
            bundle = body.policy
            fields["policy_ref"] = await ctx.state(lambda: store_bundle(ctx.backend, bundle))
        request = OperationInput(
            project=stack.project,
            workspace=stack.workspace,
            operator=by,
            **fields,
            **(await spec_fields(ctx, spec)),
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {option_error(exc)}") from None
    check_request(request)
    return request


async def memo_of(described: Any, key: str) -> Any:
    try:
        return await described.memo_value(key, None)
    except Exception:  # a memo this server cannot decode is no match
        return None


async def find_run(
    ctx: ApiContext, stack: StackRef, run_id: str
) -> tuple[WorkflowHandle[Any, Any], Any]:
    """The handle and description of the stack's run ``run_id``; NotFoundError if none."""
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise NotFoundError(f"stack {stack} has no run {run_id!r}") from None
    client = await ctx.client()
    known = ctx.known_run(stack, run_id)
    if known is not None and known[1] is not None:  # closed: its description is final
        return client.get_workflow_handle(known[0], run_id=run_id), known[1]
    for wid in candidate_ids(stack):
        handle = client.get_workflow_handle(wid, run_id=run_id)
        try:
            described = await handle.describe()
            running = (described.status or RUNNING) == RUNNING
            ctx.remember_run(stack, run_id, described.id, None if running else described)
            return handle, described
        except RPCError as exc:
            if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                continue
            raise
    raise NotFoundError(f"stack {stack} has no run {run_id}")


def operation_of(workflow_type: str) -> str:
    for operation, name in WORKFLOWS.items():
        if name == workflow_type:
            return operation.value
    return workflow_type


def failure_message(exc: WorkflowFailureError) -> tuple[str, str | None]:
    """The first typed application error down the chain (as the CLI reports it)."""
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    typed = [c for c in chain if isinstance(c, ApplicationError) and c.type]
    cause = typed[0] if typed else chain[-1]
    message = getattr(cause, "message", None) or str(cause)
    return message, getattr(cause, "type", None)


async def closed_if_ending(
    ctx: ApiContext, stack: StackRef, handle: WorkflowHandle[Any, Any], described: Any
) -> Any:
    """The run's description once it has closed, when its event stream has ended with the
    workflow's own ``run_complete`` (its release is final and it returns right after): a
    client that read the end of the stream, then asks for the run, gets its final view in
    one request instead of "running" and another try. Waits at most CLOSING_WAIT; anything
    else (still running after that, not ending yet) is the description as it was."""
    if (described.status or WorkflowExecutionStatus.RUNNING) != WorkflowExecutionStatus.RUNNING:
        return described
    last = await ctx.state(lambda: ctx.backend.last_event(stack, described.run_id))
    if last is None or last.type != EventType.run_complete or last.data.get("source"):
        return described  # not ending, or an end Temporal reported (the run had closed)
    try:
        # the result the view reads next, kept (ApiContext.final_result)
        await asyncio.wait_for(ctx.final_result(handle, result_type_of(described)), CLOSING_WAIT)
    except TimeoutError:
        return described
    except Exception:
        pass
    described = await handle.describe()
    if (described.status or RUNNING) != RUNNING:
        ctx.remember_run(stack, described.run_id, described.id, described)
    return described


async def run_view(
    ctx: ApiContext, stack: StackRef, handle: WorkflowHandle[Any, Any], described: Any
) -> RunView:
    status = described.status or WorkflowExecutionStatus.RUNNING
    view = RunView(
        run_id=described.run_id,
        workflow_id=described.id,
        operation=operation_of(described.workflow_type),
        status=status.name.lower(),
        requested_by=await memo_of(described, REQUESTED_BY_MEMO),
        message=await memo_of(described, MESSAGE_MEMO),
        started_at=described.start_time,
        ended_at=described.close_time,
    )
    drift = described.workflow_type == WORKFLOWS[RunOperation.drift]
    if status == WorkflowExecutionStatus.RUNNING:
        if not drift:
            await _running(handle, view)
    elif status == WorkflowExecutionStatus.COMPLETED:
        result = await ctx.final_result(handle, result_type_of(described))
        if isinstance(result, OperationResult):
            view.phase = result.phase
            view.revision = result.revision
            view.error = result.error
            view.error_type = result.error_type
            view.summary = dict(result.changes.get("summary") or {})
            view.done = sum(result.counts.values())
            view.total = view.done
            view.failed = result.counts.get("failed", 0)
            view.result = result.model_dump(mode="json", exclude={"changes"})
        elif isinstance(result, DriftResult):
            view.phase = Phase.succeeded
            view.revision = result.revision
            view.result = result.model_dump(mode="json")
    else:
        view.phase = Phase.failed
        try:
            await handle.result(follow_runs=False)
        except WorkflowFailureError as exc:
            view.error, view.error_type = failure_message(exc)
        except Exception as exc:
            view.error = str(exc) or status.name.lower()
    if view.revision is not None and not drift and status != WorkflowExecutionStatus.RUNNING:
        # an ended run's approver is its release's (a running one's came with its status)
        view.approved_by = await approver(ctx, stack, view.revision, described.run_id)
    return view


def result_type_of(described: Any) -> type[OperationResult] | type[DriftResult]:
    """What the described run returns."""
    drift = described.workflow_type == WORKFLOWS[RunOperation.drift]
    return DriftResult if drift else OperationResult


UNANSWERED = (
    RPCStatusCode.CANCELLED,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.FAILED_PRECONDITION,
)
"""A status query no worker answered: it timed out, or Temporal refused it at once because
no worker polled the run's task queue lately (``FAILED_PRECONDITION``, as for a while after
Temporal restarts). The run itself goes on: its view says so, not a refused call."""


async def _running(handle: WorkflowHandle[Any, Any], view: RunView) -> None:
    try:
        status = await handle.query("status", result_type=StatusView, rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status in UNANSWERED:
            view.error = (
                f"the run did not answer the status query ({exc.message}): is a worker "
                "running on its task queue?"
            )
            return
        raise
    view.phase = status.phase
    view.revision = status.revision
    view.total, view.done, view.failed = status.total, status.done, status.failed
    view.running = status.running
    view.summary = dict(status.changes.get("summary") or {})
    view.eta_seconds = status.eta_seconds
    view.error = status.error
    view.approved_by = status.approved_by


async def approver(ctx: ApiContext, stack: StackRef, revision: int, run_id: str) -> str | None:
    """Who approved the release this run made (None before a decision, or if rejected)."""
    try:
        release = await ctx.state(
            lambda: ctx.backend.get(stack, revision, with_spec=False, with_state=False)
        )
    except NotFoundError:
        return None
    if release.run_id != run_id or release.approval is None:
        return None
    return release.approval.by if release.approval.decision == "approved" else None


async def preview_of(
    ctx: ApiContext, handle: WorkflowHandle[Any, Any], described: Any
) -> dict[str, Any]:
    """The run's preview: the ``preview`` query while it runs, its result's changes after."""
    if described.workflow_type == WORKFLOWS[RunOperation.drift]:
        raise NotFoundError(f"run {described.run_id} is a drift check: it has no preview")
    status = described.status or WorkflowExecutionStatus.RUNNING
    if status == WorkflowExecutionStatus.RUNNING:
        view: dict[str, Any] = await handle.query(
            "preview", result_type=dict[str, Any], rpc_timeout=QUERY_TIMEOUT
        )
        return view
    if status != WorkflowExecutionStatus.COMPLETED:
        raise NotFoundError(f"run {described.run_id} ended {status.name.lower()}: no preview")
    result = await ctx.final_result(handle, OperationResult)
    changes: dict[str, Any] = result.changes
    return changes


STEPS = ("approve", "reject", "retry", "abort", "cancel")


async def steer(
    handle: WorkflowHandle[Any, Any],
    described: Any,
    action: str,
    by: str,
    comment: str | None,
    key: str | None,
) -> str:
    """Send the ``action`` Update (or cancel) to a running run, as ``stackflow <action>``.
    With an ``Idempotency-Key`` the Update id is derived from it: a repeated call is applied
    once."""
    if described.status not in (None, WorkflowExecutionStatus.RUNNING):
        raise OperationFailed(
            f"{action} refused: run {described.run_id} has ended ({described.status.name.lower()})"
        )
    update_id = f"{action}-" + (
        hashlib.sha256(key.encode()).hexdigest()[:32] if key else uuid.uuid4().hex
    )
    try:
        if action == "cancel":
            await handle.cancel()
            return f"cancel requested by {by}"
        result = await asyncio.wait_for(
            handle.execute_update(action, ApprovalInput(by=by, reason=comment), id=update_id),
            STEP_TIMEOUT.total_seconds(),
        )
    except TimeoutError:
        # the run's validator and handler run in a worker: none took the Update in time
        raise TemporalUnreachable(
            f"{action} not answered within {int(STEP_TIMEOUT.total_seconds())} s: no worker "
            "is taking this run's tasks (is one running?); send it again (with the same "
            "Idempotency-Key it is applied once)"
        ) from None
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        raise OperationFailed(
            f"{action} refused: run {described.run_id} has ended meanwhile"
        ) from None
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == "FourEyes":
            raise Problem(403, f"{action} refused: {cause.message}", "four-eyes") from None
        if isinstance(cause, ApplicationError) and cause.type == NOT_AWAITING_APPROVAL:
            raise Problem(409, f"{action} refused: {cause.message}", NOT_AWAITING) from None
        raise OperationFailed(
            f"{action} refused: {getattr(cause, 'message', None) or cause}"
        ) from None
    return str(result)


async def take_step(
    ctx: ApiContext,
    stack: StackRef,
    run_id: str,
    action: str,
    who: Identity,
    comment: str | None,
    key: str | None = None,
) -> StepResult:
    """The step ``action`` on the run, as ``who`` (who holds the step's role on the project)."""
    handle, described = await find_run(ctx, stack, run_id)
    result = await steer(handle, described, action, who.name, comment, key)
    return StepResult(run_id=run_id, workflow_id=handle.id, action=action, result=result)


PAGE_LIMIT = 100


def _page_token(text: str | None) -> bytes | None:
    if not text:
        return None
    try:
        padded = text.encode("ascii") + b"=" * (-len(text) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (ValueError, UnicodeEncodeError):
        raise SpecError("page_token: not a token this API gave out") from None


async def list_runs(
    ctx: ApiContext, stack: StackRef, page_size: int, page_token: str | None
) -> RunPage:
    """One page of the stack's runs (every operation, also runs the CLI or a Schedule
    started), in Temporal's visibility order: running ones first, then the newest."""
    client = await ctx.client()
    ids = ", ".join(f"'{wid}'" for wid in candidate_ids(stack))
    pages = client.list_workflows(
        f"WorkflowId IN ({ids})", page_size=page_size, next_page_token=_page_token(page_token)
    )
    try:
        await pages.fetch_next_page()
    except RPCError as exc:
        # Temporal answers a token it did not make with INVALID_ARGUMENT or UNKNOWN
        if page_token and not is_unreachable(exc):
            raise SpecError("page_token: not a token this API gave out") from None
        raise
    items = []
    for execution in pages.current_page or []:
        status = execution.status or WorkflowExecutionStatus.RUNNING
        items.append(
            RunSummary(
                run_id=execution.run_id,
                workflow_id=execution.id,
                operation=operation_of(execution.workflow_type),
                status=status.name.lower(),
                requested_by=await memo_of(execution, REQUESTED_BY_MEMO),
                message=await memo_of(execution, MESSAGE_MEMO),
                started_at=execution.start_time,
                ended_at=execution.close_time,
            )
        )
    token = pages.next_page_token
    return RunPage(
        runs=items,
        next_page_token=base64.urlsafe_b64encode(token).decode().rstrip("=") if token else None,
    )
