"""Whether the run that holds a stack is still alive: Temporal knows, so the worker asks it
(:mod:`stackflow.temporal.runs` holds the asking)."""

from __future__ import annotations

from typing import Protocol

from temporalio import activity

from stackflow.core.refs import RunRef
from stackflow.state.backend import StackLock
from stackflow.temporal.runs import run_ended, run_link


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
