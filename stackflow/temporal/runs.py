"""What Temporal says of a run: its page in the Temporal UI, whether it ended, and freeing a
stack by hand once the run that held it has ended (the API's ``release unlock``; the worker asks
the same through :class:`stackflow.activities.runs.TemporalRunOracle`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.errors import ConflictError, NotFoundError, StackLockedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Unlocked

if TYPE_CHECKING:
    from stackflow.state.backend import StateBackend


def run_link(run: RunRef, namespace: str | None = None) -> str:
    """The run's page in the Temporal UI (``STACKFLOW_TEMPORAL_UI``, default the dev
    server's)."""
    base = os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233")
    ns = namespace or os.environ.get("TEMPORAL_NAMESPACE", "default")
    return (
        f"{base.rstrip('/')}/namespaces/{quote(ns, safe='')}/workflows/"
        f"{quote(run.workflow_id, safe='')}/{quote(run.run_id, safe='')}"
    )


async def run_ended(client: Client, run: RunRef) -> str | None:
    """None while ``run`` is open; else how it ended, in words ("run … was terminated")."""
    handle = client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return f"{run} no longer exists in Temporal"
        raise
    status = described.status
    if status is None or status == WorkflowExecutionStatus.RUNNING:
        return None
    words = {
        WorkflowExecutionStatus.CANCELED: "cancelled",
        WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
        WorkflowExecutionStatus.TIMED_OUT: "timed out",
    }
    return f"{run} was {words.get(status, status.name.lower())}"


async def unlock_by_hand(
    backend: StateBackend,
    stack: StackRef,
    ended: Callable[[RunRef], Awaitable[str | None]],
    *,
    force: bool = False,
    by: str | None = None,
) -> Unlocked:
    """Free ``stack`` whose run ended without releasing it: its release becomes failed,
    saying why. Refused (StackLockedError, exit 3 / 409) while the holding run is still open
    as ``ended`` (asked about the holder) says, unless ``force``; NotFoundError when the
    stack has no releases; ConflictError when the lock changed hands meanwhile. ``by``: who
    (recorded in the reason), when it is not the local user (the API's caller)."""
    lock = await asyncio.to_thread(backend.lock, stack)
    if lock is None:
        latest = await asyncio.to_thread(lambda: backend.latest(stack, with_spec=False))
        if latest is None:
            raise NotFoundError(f"stack {stack} has no releases")
        return Unlocked(
            project=stack.project,
            workspace=stack.workspace,
            unlocked=False,
            revision=latest.revision,
            phase=latest.phase,
        )
    holder = lock.holder()
    hand = f"unlocked by hand by {by}" if by else "unlocked by hand"
    reason = f"{hand}; the operation may not have finished"
    if holder is not None and not force:
        why = await ended(holder)
        if why is None:
            raise StackLockedError(
                f"stack {stack} is held by {holder}, which is still running "
                f"({run_link(holder)}); cancel it (temporal workflow cancel, or the Temporal "
                "UI) or pass --force"
            )
        reason = f"{why}; {hand}"
    elif holder is not None:
        reason = f"{hand} with --force while {holder} held it"
    if not await asyncio.to_thread(backend.recover, lock, reason):
        raise ConflictError(
            f"stack {stack} changed hands while unlocking ({lock.describe()} "
            "no longer holds it); look again with `stackflow release list`"
        )
    after = await asyncio.to_thread(lambda: backend.latest(stack, with_spec=False))
    assert after is not None
    return Unlocked(
        project=stack.project,
        workspace=stack.workspace,
        unlocked=True,
        revision=after.revision,
        phase=after.phase,
        reason=reason,
    )
