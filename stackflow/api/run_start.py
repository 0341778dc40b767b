"""Starting a run through the API: the same workflow input the CLI sends, under the stack's
workflow id, so a busy stack is refused at once.

``Idempotency-Key``: a start with a key claims it in the state backend every API replica
shares (:class:`~stackflow.state.protocols.RunKeys`, for :data:`IDEMPOTENCY_WINDOW`) before it
starts anything, and records the run it made: a retried request is that run (200), the same
key with another body is a 422. The key also goes in the memo of the run
(``stackflow-idempotency``: the key and the sha256 of the request): a claim whose run was
never recorded (the API stopped between the start and the record) is found through
Temporal's visibility, and a start refused because the stack is busy looks at the running
run's memo (a request made twice at once).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from stackflow.api.context import ApiContext
from stackflow.api.identity import Role
from stackflow.api.models import WORKFLOWS, RunRequest
from stackflow.api.problems import Problem
from stackflow.api.runs import (
    IDEMPOTENCY_MEMO,
    IDEMPOTENCY_WINDOW,
    KEY_LIMIT,
    MESSAGE_MEMO,
    REQUESTED_BY_MEMO,
    candidate_ids,
    memo_of,
    workflow_id_of,
    workflow_input,
)
from stackflow.core.errors import SpecError, StackLockedError
from stackflow.core.refs import StackRef
from stackflow.temporal.client import START_TOKEN
from stackflow.temporal.operation import DriftInput, OperationInput


class Started:
    def __init__(self, handle: WorkflowHandle[Any, Any], run_id: str, created: bool) -> None:
        self.handle = handle
        self.run_id = run_id
        self.created = created


def request_digest(stack: StackRef, body: RunRequest) -> str:
    """What ``Idempotency-Key`` binds to: the stack and the request as validated."""
    data = {"stack": str(stack), "body": body.model_dump(mode="json")}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def reused(key: str, run_id: str | None) -> Problem:
    made = f" (run {run_id})" if run_id else ""
    return Problem(
        422,
        f"Idempotency-Key {key!r} was used for another request{made}; use a new key "
        "for a new request",
        "idempotency-key-reused",
    )


async def keyed_run(
    client: Client, stack: StackRef, key: str, digest: str
) -> tuple[str, str] | None:
    """(workflow id, run id) of the stack's run started with ``key`` in the window; Problem
    422 when it was started with another request."""
    since = (datetime.now(UTC) - IDEMPOTENCY_WINDOW).strftime("%Y-%m-%dT%H:%M:%SZ")
    ids = ", ".join(f"'{wid}'" for wid in candidate_ids(stack))
    query = f"WorkflowId IN ({ids}) AND StartTime > '{since}'"
    async for execution in client.list_workflows(query, limit=200):
        held = await memo_of(execution, IDEMPOTENCY_MEMO)
        if isinstance(held, dict) and held.get("key") == key:
            if held.get("digest") != digest:
                raise reused(key, execution.run_id)
            return execution.id, execution.run_id
    return None


async def start_run(
    ctx: ApiContext, stack: StackRef, body: RunRequest, by: str, key: str | None, *, role: Role
) -> Started:
    """Start the run ``body`` asks for, requested by ``by`` (of ``role`` on the project:
    what only an approver may ask is refused for less, see :func:`~stackflow.api.runs.
    check_role`)."""
    if key is not None and (not key or len(key) > KEY_LIMIT or not key.isprintable()):
        raise SpecError(f"Idempotency-Key: 1 to {KEY_LIMIT} printable characters")
    request = await workflow_input(ctx, stack, body, by, role)
    client = await ctx.client()
    digest = request_digest(stack, body)
    claimed = False
    if key is not None:
        found = await _keyed(ctx, client, stack, key, digest)
        if isinstance(found, Started):
            return found
        claimed = found
    try:
        started = await _start(ctx, client, stack, body, request, by, key, digest)
    except StackLockedError:
        if claimed and key is not None:  # refused: nothing started, the key is free again
            await ctx.state(lambda: ctx.backend.drop_run_key(stack, key))
        raise
    # (any other failure keeps the claim: the start may have reached Temporal, and a retry
    # looks for its run by the key in the run's memo before it starts another)
    if key is not None:
        run_id, wid = started.run_id, started.handle.id
        await ctx.state(lambda: ctx.backend.record_run_key(stack, key, wid, run_id))
    return started


async def _keyed(
    ctx: ApiContext, client: Client, stack: StackRef, key: str, digest: str
) -> Started | bool:
    """The run a start with ``key`` already made (Problem 422 when it was made for another
    request); else whether this call claimed the key (False: an earlier claim made no run
    that was recorded, nor one Temporal knows of: this start goes on under that claim)."""
    held = await ctx.state(
        lambda: ctx.backend.claim_run_key(stack, key, digest, window=IDEMPOTENCY_WINDOW)
    )
    if held is None:
        return True
    if not held.same_request:
        raise reused(key, held.run_id)
    if held.workflow_id is not None and held.run_id is not None:
        handle = client.get_workflow_handle(held.workflow_id, run_id=held.run_id)
        return Started(handle, held.run_id, created=False)
    found = await keyed_run(client, stack, key, digest)
    if found is None:
        return False
    wid, rid = found
    await ctx.state(lambda: ctx.backend.record_run_key(stack, key, wid, rid))
    return Started(client.get_workflow_handle(wid, run_id=rid), rid, created=False)


async def _start(
    ctx: ApiContext,
    client: Client,
    stack: StackRef,
    body: RunRequest,
    request: OperationInput | DriftInput,
    by: str,
    key: str | None,
    digest: str,
) -> Started:
    workflow = WORKFLOWS[body.operation]
    wid = workflow_id_of(stack, body.operation)
    memo: dict[str, Any] = {START_TOKEN: uuid.uuid4().hex, REQUESTED_BY_MEMO: by}
    if key is not None:
        memo[IDEMPOTENCY_MEMO] = {"key": key, "digest": digest}
    if body.message:
        memo[MESSAGE_MEMO] = body.message
    spec = getattr(request, "spec", None)
    summary = f"{body.operation} {stack}" + (
        f": {len(spec.get('resources') or [])} resources" if spec else ""
    )
    try:
        handle = await client.start_workflow(
            workflow,
            request,
            id=wid,
            task_queue=ctx.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            memo=memo,
            static_summary=summary + f" (by {by} through the API)",
        )
    except WorkflowAlreadyStartedError as exc:
        holder = client.get_workflow_handle(wid)
        described = await holder.describe()
        held = await memo_of(described, IDEMPOTENCY_MEMO)
        if key is not None and isinstance(held, dict) and held.get("key") == key:
            if held.get("digest") != digest:
                raise reused(key, described.run_id) from None
            return Started(holder, described.run_id, created=False)
        running = exc.run_id or described.run_id
        raise StackLockedError(
            f"stack {stack} already has an operation running (workflow {wid}, run {running}); "
            "wait for it or steer it"
        ) from None
    return Started(handle, handle.result_run_id or "", created=True)
