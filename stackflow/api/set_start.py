"""Starting a set run through the API: ``POST /v1/sets/{name}/runs`` (a stack-graph body)
and a signed push to a repository a set is bound to (the graph file at the pushed commit).

A set's git source is kept as a stack's is, under the set's own stack ``@set/<name>``
(:func:`~stackflow.api.set_events.set_stack`): the same binding store, the same signature
check, replay refusal (:mod:`stackflow.api.hook_replay`) and ``Idempotency-Key``
``git:<commit>`` claim (:class:`~stackflow.state.protocols.RunKeys`), so a redelivery of a
delivery, or the same commit pushed again, is that one set run."""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from typing import Any

from pydantic import BaseModel
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from stackflow.api.context import ApiContext
from stackflow.api.runs import IDEMPOTENCY_WINDOW
from stackflow.api.set_events import set_stack
from stackflow.core.errors import SpecError, StackLockedError
from stackflow.core.refs import StackRef
from stackflow.engine.spec import parse_spec_text
from stackflow.engine.stack_set import load_set_text
from stackflow.model.source import BoundSource, SourceMode, SourceRef
from stackflow.model.stack_set import Strategy
from stackflow.state.git_sources import git_cache, read_spec_file
from stackflow.temporal.client import START_TOKEN
from stackflow.temporal.stack_set import Member, SetOperation, checked_set_input, set_workflow_id


class SetRunCreated(BaseModel):
    workflow_id: str
    run_id: str
    status_url: str


def created(name: str, run_id: str) -> SetRunCreated:
    return SetRunCreated(
        workflow_id=set_workflow_id(name),
        run_id=run_id,
        status_url=f"/v1/sets/{name}/runs/{run_id}",
    )


async def launch_set(
    ctx: ApiContext,
    name: str,
    operation: SetOperation,
    members: list[Member],
    strategy: Strategy | None,
    *,
    operator: str,
    summary: str,
    **options: Any,
) -> SetRunCreated:
    """Check the set whole (SpecError: one line) and start its run (StackLockedError when
    the set has one running)."""
    inp = await ctx.state(
        lambda: checked_set_input(
            ctx.backend, name, operation, members, strategy, operator=operator, **options
        )
    )
    client = await ctx.client()
    try:
        handle = await client.start_workflow(
            "SetWorkflow",
            inp,
            id=set_workflow_id(name),
            task_queue=ctx.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            memo={START_TOKEN: uuid.uuid4().hex},
            static_summary=f"set {operation} {name} ({summary})",
        )
    except WorkflowAlreadyStartedError as exc:
        raise StackLockedError(f"set {name} already has a run (run {exc.run_id})") from None
    return created(name, handle.result_run_id or "")


def set_name(stack: StackRef) -> str | None:
    """The set whose binding ``stack`` is (None: a stack's own)."""
    return stack.workspace if stack == set_stack(stack.workspace) else None


def graph_members(
    name: str, source: BoundSource, commit: str
) -> tuple[list[Member], Strategy | None]:
    """The set file at ``commit``: its stacks, each spec file (beside it) read at that commit
    too, so the set is checked whole (references, cycles) before anything starts."""
    cache, where = git_cache(), f"set {name}: {source.url}@{commit[:12]}"

    def read(path: str) -> str:
        return read_spec_file(
            SourceRef(url=source.url, commit=commit, path=path), cache, source.ref
        )

    shop = load_set_text(read(source.path), f"{where}:{source.path}")
    if shop.name != name:
        raise SpecError(f"{where}:{source.path} is set {shop.name}'s file, not this set's")
    members = []
    for m in shop.stacks:
        spec = None
        if m.spec is not None:
            path = posixpath.join(posixpath.dirname(source.path), m.spec)
            spec = parse_spec_text(read(posixpath.normpath(path)), f"{where}:{path}")
        git = None if m.git is None else m.git.source()
        stack = StackRef(m.project, m.workspace)
        members.append(Member(stack, m.depends_on, spec, git, m.context))
    return members, shop.strategy


async def start_pushed_set(
    ctx: ApiContext, name: str, source: BoundSource, commit: str, by: str
) -> tuple[SetRunCreated, bool]:
    """The set run of the pushed ``commit`` (and whether this delivery started it): the
    delivery's key claimed first, freed again when nothing starts."""
    stack, key = set_stack(name), f"git:{commit}"
    digest = hashlib.sha256(f"{stack}\n{source.url}\n{commit}".encode()).hexdigest()
    held = await ctx.state(
        lambda: ctx.backend.claim_run_key(stack, key, digest, window=IDEMPOTENCY_WINDOW)
    )
    if held is not None:
        if held.run_id is None:
            raise StackLockedError(f"set {name}: a delivery of {commit[:12]} is starting it")
        return created(name, held.run_id), False
    try:
        members, strategy = await ctx.state(lambda: graph_members(name, source, commit))
        apply = source.on_push == SourceMode.apply
        started = await launch_set(
            ctx,
            name,
            SetOperation(source.on_push.value),
            members,
            strategy,
            operator=by,
            summary=f"git push of {commit[:12]} to {source.branch_ref}",
            auto_approve=apply and source.auto_approve,
        )
    except (SpecError, StackLockedError):
        await ctx.state(lambda: ctx.backend.drop_run_key(stack, key))
        raise
    rid = started.run_id
    await ctx.state(lambda: ctx.backend.record_run_key(stack, key, started.workflow_id, rid))
    return started, True
