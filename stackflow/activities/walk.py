"""Walking a plan: apply or delete one node, or a group of cheap nodes in one activity, load a
batch child's nodes, and move the release through its phases.

Each activity is idempotent (apply is declarative, deleting a missing object succeeds,
release writes are upserts) and returns a small summary: the full live state goes to the
state backend, never into workflow history. Every state write is fenced by the run that
holds the stack (:class:`~stackflow.activities.stack_guard.StackGuard`): the calling run, or
for a batch child the parent named in the input."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors, to_application_error
from stackflow.activities.events import EventSink, event_sink, record_events
from stackflow.activities.heartbeat import heartbeating
from stackflow.activities.notify import announce
from stackflow.activities.resource_step import COALESCED_PARALLELISM, ResourceStep, digest
from stackflow.activities.stack_guard import StackGuard, calling_run, read_scope_key
from stackflow.core.refs import StackRef
from stackflow.engine.budget import short_error
from stackflow.engine.masking import SecretSet
from stackflow.model.events import EventType, NewEvent, run_complete
from stackflow.model.plan import PlannedNode
from stackflow.model.release import Approval, Phase, Release
from stackflow.model.spec import Resource
from stackflow.runtimes.base import read_scope
from stackflow.temporal import metrics
from stackflow.temporal.activity_io import (
    EventsInput,
    GroupInput,
    LoadBatchInput,
    LoadedBatch,
    NodeInput,
    PhaseInput,
)
from stackflow.temporal.operation import NodeResult, NodeStatus
from stackflow.temporal.wire import BatchActions

log = logging.getLogger(__name__)

T = TypeVar("T")


async def to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """``work`` (a runtime call and the state write that records it) run to its end even when
    the activity is cancelled meanwhile; the cancel is raised after it. A cancelled run's
    release then holds every object the run changed, and the next run does not change it
    again."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the cancel is what this activity reports
        raise


class WalkActivities:
    def __init__(self, deps: Deps, guard: StackGuard, step: ResourceStep) -> None:
        self.registry = deps.registry
        self.backend = deps.backend
        self.events = deps.events
        self.specs = deps.specs
        self.plans = deps.plans
        self.cache = deps.cache
        self.guard = guard
        self.step = step
        self._warming: set[asyncio.Task[None]] = set()
        """Caches being warmed after their activity answered (kept referenced)."""

    # ---- one node --------------------------------------------------------------------------
    @activity.defn(name="apply_resource")
    async def apply_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"apply {inp.resource_id}"), self._events(inp) as sink:
                try:
                    return await self._apply(inp, sink)
                except Exception as exc:
                    raise self._errored(sink, inp, exc) from None

    def _events(self, inp: NodeInput | GroupInput) -> AbstractAsyncContextManager[EventSink]:
        return event_sink(self.events, inp.stack, calling_run(inp.owner))

    @staticmethod
    def _errored(sink: EventSink, inp: NodeInput, exc: Exception) -> BaseException:
        """The failure as it leaves the activity; a final one is the node's apply_errored."""
        error = to_application_error(exc, inp.unavailable_timeout_seconds)
        if isinstance(error, ApplicationError) and error.non_retryable:
            message = short_error(error.message) or error.type or "failed"
            sink.errored(inp.resource_id, inp.action, message, error.type)
        return error

    async def _apply(self, inp: NodeInput, sink: EventSink) -> NodeResult:
        step, guard = self.step, self.guard
        spec_resources = (
            await asyncio.to_thread(self.specs.resources, inp.spec_ref) if inp.spec_ref else {}
        )
        wanted = step.ids_to_read(inp, spec_resources)
        stack = inp.stack
        state = await asyncio.to_thread(self.backend.resources, stack, inp.revision, wanted)
        run = calling_run(inp.owner)
        secrets = await asyncio.to_thread(step.secrets.of, stack)
        job = step.apply_job(inp, spec_resources, state, step.node_options(inp, run), secrets)

        async def fence() -> None:
            await guard.assert_holds(run, stack, inp.revision)

        async def record(attributes: dict[str, Any]) -> None:
            applied = job.applied(attributes)
            await guard.write(
                run,
                stack,
                lambda: self.backend.record_resource(stack, inp.revision, applied, run=run),
            )

        async def apply_and_record() -> dict[str, Any]:
            applied = await step.apply(job, fence)
            await record(applied)
            return applied

        sink.started(inp.resource_id, str(job.resource.type), inp.action)
        # Recorded before any readiness wait: an object that never gets ready is still the
        # stack's (a later destroy removes it).
        live = await to_the_end(apply_and_record())
        if inp.watch:
            live = await job.runtime.wait_ready(job.request, job.options)
            await record(live)
        sink.completed(inp.resource_id)
        return NodeResult(
            id=job.resource.id, action=inp.action, status=NodeStatus.succeeded, digest=digest(live)
        )

    @activity.defn(name="delete_resource")
    async def delete_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"delete {inp.resource_id}"), self._events(inp) as sink:
                try:
                    return await self._delete(inp, sink)
                except Exception as exc:
                    raise self._errored(sink, inp, exc) from None

    async def _delete(self, inp: NodeInput, sink: EventSink) -> NodeResult:
        guard, stack = self.guard, inp.stack
        recorded = await asyncio.to_thread(
            self.backend.resource_state, stack, inp.revision, inp.resource_id
        )
        run = calling_run(inp.owner)
        sink.started(inp.resource_id, None if recorded is None else str(recorded.type), "Delete")
        if recorded is not None:

            async def fence() -> None:
                await guard.assert_holds(run, stack, inp.revision)

            async def delete_and_record() -> None:
                await self.step.delete(recorded, self.step.node_options(inp, run), fence)
                await guard.write(
                    run,
                    stack,
                    lambda: self.backend.record_deletion(
                        stack, inp.revision, inp.resource_id, run=run
                    ),
                )

            await to_the_end(delete_and_record())
        sink.completed(inp.resource_id)
        # Not in state any more: an earlier attempt already deleted and recorded it.
        return NodeResult(id=inp.resource_id, action="Delete", status=NodeStatus.succeeded)

    # ---- groups of cheap nodes ---------------------------------------------------------------
    @activity.defn(name="run_group")
    async def run_group(self, inp: GroupInput) -> list[NodeResult]:
        """Apply or delete several ready nodes at once, each on its own (idempotent, as one
        node's activity). A node that fails for good (invalid input, conflict, fenced,
        unreachable past the timeout) gets a failed result; a failure worth retrying
        (unavailable, a first bug) makes the whole group retry, and the nodes that already
        succeeded simply apply again."""
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"{len(inp.nodes)} resources"), self._events(inp) as sink:
                return await self._run_group(inp, sink)

    async def _run_group(self, inp: GroupInput, sink: EventSink) -> list[NodeResult]:
        """One state read, one lock check and one write per group; each node's runtime call
        on its own (side by side), each node's failure its own."""
        step, guard = self.step, self.guard
        run = calling_run(inp.owner)
        stack, revision = inp.stack, inp.revision
        options = step.node_options(inp, run)
        spec_resources = (
            await asyncio.to_thread(self.specs.resources, inp.spec_ref) if inp.spec_ref else {}
        )
        nodes = {
            rid: NodeInput(
                project=inp.project,
                workspace=inp.workspace,
                revision=revision,
                spec_ref=inp.spec_ref,
                resource_id=rid,
                action=action,
                force=inp.force,
                adopt=inp.adopt,
                owner=inp.owner,
                unavailable_timeout_seconds=inp.unavailable_timeout_seconds,
            )
            for rid, action in inp.nodes
        }
        outcome: dict[str, NodeResult | Exception] = {}
        wanted: dict[str, list[str]] = {}
        for rid, node in nodes.items():
            try:
                wanted[rid] = (
                    [rid] if node.action == "Delete" else step.ids_to_read(node, spec_resources)
                )
            except Exception as exc:
                outcome[rid] = exc
        every = sorted({i for ids in wanted.values() for i in ids})
        state = await asyncio.to_thread(self.backend.resources, stack, revision, every)
        secrets = (
            await asyncio.to_thread(step.secrets.of, stack)
            if any(action != "Delete" for _, action in inp.nodes)
            else SecretSet()
        )
        await guard.assert_holds(run, stack, revision)
        applied: dict[str, Resource] = {}
        deleted: list[str] = []
        gate = asyncio.Semaphore(inp.concurrency)
        merged = asyncio.Semaphore(COALESCED_PARALLELISM)

        def gate_for(rid: str) -> asyncio.Semaphore:
            found = state.get(rid) if nodes[rid].action == "Delete" else spec_resources.get(rid)
            runtime = self.registry.find(str(found.type)) if found is not None else None
            return merged if runtime is not None and runtime.coalesces_calls else gate

        cancelled = False

        async def one(rid: str) -> None:
            async with gate_for(rid):
                if not cancelled:
                    await node_step(rid)

        async def node_step(rid: str) -> None:
            node = nodes[rid]
            found = state.get(rid) if node.action == "Delete" else spec_resources.get(rid)
            sink.started(rid, None if found is None else str(found.type), node.action)
            try:
                if node.action == "Delete":
                    recorded = state.get(rid)
                    if recorded is not None:
                        await step.delete(recorded, options)
                        deleted.append(rid)
                    outcome[rid] = NodeResult(id=rid, action="Delete", status=NodeStatus.succeeded)
                    sink.completed(rid)
                    return
                mine = {i: state[i] for i in wanted[rid] if i in state}
                job = step.apply_job(node, spec_resources, mine, options, secrets)
                live = await step.apply(job)
                applied[rid] = job.applied(live)
                outcome[rid] = NodeResult(
                    id=rid, action=node.action, status=NodeStatus.succeeded, digest=digest(live)
                )
                sink.completed(rid)
            except Exception as exc:  # classified below, per node
                outcome[rid] = exc

        # a walk of the run whose preview may have listed these objects on this worker
        with read_scope(read_scope_key(run), lists=False):
            steps = [asyncio.ensure_future(one(rid)) for rid in wanted]
            try:
                if steps:
                    await asyncio.wait(steps)
            except asyncio.CancelledError:
                # The run is being cancelled: nothing more starts, the calls under way end,
                # and what they applied or deleted is recorded before the cancel is reported.
                cancelled = True
                await asyncio.wait(steps)
        order = [rid for rid, _ in inp.nodes]
        await guard.write(
            run,
            stack,
            lambda: self.backend.record_resources(
                stack, revision, [applied[i] for i in order if i in applied], run=run
            ),
        )
        await guard.write(
            run,
            stack,
            lambda: self.backend.record_deletions(stack, revision, deleted, run=run),
        )
        if cancelled:
            raise asyncio.CancelledError("cancelled")
        return self._group_results(inp, outcome, sink)

    @staticmethod
    def _group_results(
        inp: GroupInput, outcome: dict[str, NodeResult | Exception], sink: EventSink
    ) -> list[NodeResult]:
        """Each node's result, in the group's order; raises the first failure worth a retry
        (what succeeded is recorded: the retry applies it again, harmlessly)."""
        results: list[NodeResult] = []
        again: BaseException | None = None
        for rid, action in inp.nodes:
            done = outcome[rid]
            if isinstance(done, NodeResult):
                results.append(done)
                continue
            error = to_application_error(done, inp.unavailable_timeout_seconds)
            if isinstance(error, ApplicationError) and error.non_retryable:
                message = short_error(error.message) or error.type
                results.append(
                    NodeResult(
                        id=rid,
                        action=action,
                        status=NodeStatus.failed,
                        error=message,
                        error_type=error.type,
                    )
                )
                sink.errored(rid, action, message or "failed", error.type)
            elif again is None:
                again = error
        if again is not None:
            raise again
        return results

    # ---- plan reads and phases ---------------------------------------------------------------
    @activity.defn(name="load_batch")
    async def load_batch(self, inp: LoadBatchInput) -> LoadedBatch:
        with temporal_errors():
            return await asyncio.to_thread(self._load_batch, inp)

    def _load_batch(self, inp: LoadBatchInput) -> LoadedBatch:
        plan = self.plans.get(inp.plan_ref)
        every = plan.of(inp.deletions)
        picked = [(every[inp.start + i], code) for i, code in BatchActions.decode(inp.actions)]
        inside = {node.id for node, _ in picked}
        not_ok = {every[i].id for i in inp.not_ok}
        blocked = sorted({d for node, _ in picked for d in node.deps if d in not_ok})
        # The walk only looks at deps inside the batch and at blocked ones: the others
        # succeeded in earlier batches, so they stay out of the child's history.
        relevant = inside.union(blocked)
        nodes = [
            PlannedNode(
                id=node.id,
                type=node.type,
                action=code.action,
                deps=[d for d in node.deps if d in relevant],
            )
            for node, code in picked
        ]
        return LoadedBatch(nodes=nodes, blocked=blocked)

    @activity.defn(name="set_phase")
    async def set_phase(self, inp: PhaseInput) -> None:
        with temporal_errors():
            run = calling_run()
            approval = Approval.model_validate(inp.approval) if inp.approval else None

            def write() -> Release:
                return self.backend.set_phase(
                    inp.stack,
                    inp.revision,
                    inp.phase,
                    run=run,
                    error=inp.error,
                    changes=inp.changes,
                    approval=approval,
                    policy=inp.policy,
                )

            release = await self.guard.write(run, inp.stack, write)
            events = [
                *inp.events,
                NewEvent(
                    type=EventType.phase,
                    key=f"phase/{inp.phase}",
                    data={"phase": inp.phase.value, "revision": inp.revision},
                ),
            ]
            if release.phase.is_final:
                events.append(
                    run_complete(
                        release.phase.value,
                        revision=inp.revision,
                        error=release.error,
                        counts=inp.counts,
                    )
                )
            keyed = await asyncio.to_thread(record_events, self.events, inp.stack, run, events)
            await announce(self.backend, inp.stack, run, keyed)
            metrics.current().runs_completed(release.operation, events)
            if release.phase == Phase.succeeded:
                self._warm(inp.stack, inp.revision)

    @activity.defn(name="append_events")
    async def append_events(self, inp: EventsInput) -> None:
        """Events only the workflow knows (a change summary, an approval wait, a preview's
        end), appended to the calling run's stream."""
        with temporal_errors():
            run = calling_run()
            keyed = await asyncio.to_thread(record_events, self.events, inp.stack, run, inp.events)
            await announce(self.backend, inp.stack, run, keyed)
            metrics.current().runs_completed(None, inp.events)  # a preview's end

    def _warm(self, stack: StackRef, revision: int) -> None:
        """A succeeded release becomes the prior state the next diff reads (Redis), after the
        activity has answered: the run's end does not wait for a cache, whose reads fill in
        what this misses (a worker stopped meanwhile, Redis down)."""
        work = asyncio.to_thread(self._cache_release, stack, revision)
        task = asyncio.get_running_loop().create_task(work)
        self._warming.add(task)
        task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Task[None]) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("prior state not cached: %s", short_error(str(task.exception())))

    def _cache_release(self, stack: StackRef, revision: int) -> None:
        self.cache.remember(stack, revision)
