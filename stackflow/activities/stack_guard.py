"""The stack lock, seen from the activities: the one place a release is opened, a stale
lock recovered and a state write fenced.

The lock belongs to a run (:class:`RunRef`): :meth:`StackGuard.open_release` takes it for the
calling run (or finds the release this very run opened before a retry); a stack held by a run
that Temporal says has closed is recovered first (its release closed as failed, saying why).
Every state write goes through :meth:`StackGuard.write`, a compare-and-set on the run in the
backend's transaction; when the holder is an earlier run of the same workflow that has closed
(a ``temporal workflow reset`` replaced it), the new run takes the stack over and writes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.core.errors import FencedError, StackLockedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Release
from stackflow.model.source import SourceRef
from stackflow.state.backend import StackLock
from stackflow.temporal import metrics

T = TypeVar("T")

OPEN_ATTEMPTS = 5
"""How often opening a release looks at a new holder before giving up (contention)."""


def calling_run(owner: RunRef | None = None) -> RunRef:
    """The run whose writes these are: the one named (a batch child's parent) or the run of
    the calling activity."""
    if owner is not None:
        return owner
    info = activity.info()
    return RunRef(info.workflow_id or "", info.workflow_run_id or "")


def read_scope_key(run: RunRef | None = None) -> str:
    """Which run's reads a read scope holds: ``run``, else the calling activity's run (outside
    an activity, e.g. in tests: a key of its own). One format for the preview that lists and
    the walk that looks its listing up."""
    if run is None:
        try:
            info = activity.info()
        except RuntimeError:
            return uuid.uuid4().hex
        run = RunRef(info.workflow_id or "", info.workflow_run_id or "")
    return f"{run.workflow_id}/{run.run_id}"


class StackGuard:
    def __init__(self, deps: Deps) -> None:
        self.backend = deps.backend
        self.oracle = deps.oracle

    async def open_release(
        self,
        stack: StackRef,
        operation: Operation,
        spec_ref: str | None,
        run: RunRef,
        source_revision: int | None = None,
        source: SourceRef | None = None,
        set_run: str | None = None,
    ) -> Release:
        """Create the next release for ``run``, or find the one this very run created before
        a retry. A stack held by a run that has closed is recovered first."""
        for _ in range(OPEN_ATTEMPTS):
            lock = await asyncio.to_thread(self.backend.lock, stack)
            if lock is not None and lock.held_by(run):
                return await asyncio.to_thread(
                    self.backend.get, stack, lock.revision, with_spec=False
                )
            if lock is not None:
                await self.recover_or_refuse(lock)
            try:
                release = await asyncio.to_thread(
                    lambda: self.backend.create(
                        stack,
                        operation,
                        spec_ref=spec_ref,
                        run=run,
                        source_revision=source_revision,
                        source=source,
                        set_run=set_run,
                    )
                )
            except StackLockedError:
                continue  # taken meanwhile: look at the new holder
            metrics.current().lock("acquired")
            return release
        metrics.current().lock("contended")
        raise StackLockedError(f"stack {stack}: too much contention for its lock")

    async def recover_or_refuse(self, lock: StackLock) -> None:
        """Close the release of a holder that has ended; refuse (naming it) one still open."""
        ended = await self.oracle.ended(lock)
        if ended is None:
            metrics.current().lock("refused")
            holder = lock.holder()
            link = self.oracle.link(holder) if holder else None
            raise StackLockedError(
                f"stack {lock.stack} is locked by {lock.describe()}, which is still running"
                + (f" ({link})" if link else "")
                + "; wait for it, or approve/cancel it in the Temporal UI"
                if holder
                else f"stack {lock.stack} is locked by {lock.describe()}; if no operation is "
                f"running, unlock it: stackflow release unlock {lock.stack.cli_flags}"
            )
        recovered = await asyncio.to_thread(
            self.backend.recover, lock, f"{ended}; recovered by the next operation"
        )
        if recovered:
            metrics.current().lock("recovered")
            activity.logger.warning("recovered stack %s: %s", lock.stack, ended)

    async def write(self, run: RunRef, stack: StackRef, write: Callable[[], T]) -> T:
        """Run the fenced ``write`` (a backend call that checks ``run`` holds the stack); if
        the stack is held by an earlier run of the same workflow that has closed (a reset
        replaced it), take the stack over and write."""
        try:
            return await asyncio.to_thread(write)
        except FencedError:
            lock = await asyncio.to_thread(self.backend.lock, stack)
            if (
                lock is None
                or lock.workflow_id != run.workflow_id
                or lock.run_id == run.run_id
                or await self.oracle.ended(lock) is None
                or not await asyncio.to_thread(self.backend.transfer, lock, run)
            ):
                metrics.current().lock("fenced")
                raise
            metrics.current().lock("taken_over")
            activity.logger.warning("%s took over %s from a closed run", run, lock.describe())
            return await asyncio.to_thread(write)

    async def assert_holds(self, run: RunRef, stack: StackRef, revision: int) -> None:
        """Before a runtime call: ``run`` still holds the stack at ``revision``."""
        await self.write(run, stack, lambda: self.backend.assert_holds(stack, revision, run))
