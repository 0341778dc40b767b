"""Whether the run that holds a stack is still alive: Temporal knows, so we ask it."""

from __future__ import annotations

import os
from typing import Protocol
from urllib.parse import quote

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from stackflow.core.refs import RunRef
from stackflow.state.backend import StackLock


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


class RunOracle(Protocol):
    async def ended(self, lock: StackLock) -> str | None:
        """None while the lock's run is open (or the lock names no run)."""

    def link(self, run: RunRef) -> str: ...


class TemporalRunOracle:
    """Asks the Temporal service the activity's worker is connected to."""

    async def ended(self, lock: StackLock) -> str | None:
        holder = lock.holder()
        if holder is None:
            return None  # an imported release in progress: only a person can tell
        return await run_ended(activity.client(), holder)

    def link(self, run: RunRef) -> str:
        return run_link(run, activity.info().workflow_namespace if activity.in_activity() else None)
