"""A cancelled resource activity ends the runtime calls it had started and records them before
it reports the cancel; it starts nothing more. So a cancelled run's release holds every object
the run changed, and the next run does not apply it again.

The activities run in temporalio's ActivityEnvironment (its ``cancel()`` is what a workflow's
cancel request does to a running activity) on each real state backend; the runtime here only
holds each call until the test lets it go, so the cancel lands while calls are under way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from stackflow.activities import WorkerActivities
from stackflow.core.refs import StackRef
from stackflow.runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StackLock, StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.temporal.activity_io import GroupInput, NodeInput, PrepareInput
from stackflow.temporal.operation import OperationInput

STACK = StackRef("p", "w")
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
IDS = [f"r{i}" for i in range(6)]


class HeldRuntime(Runtime):
    """Each apply or delete starts, then waits until the test releases it."""

    type_name = "OnPrem"

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.release = asyncio.Event()

    async def _held(self, rid: str) -> None:
        self.started.append(rid)
        await self.release.wait()
        self.finished.append(rid)

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return None

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        await self._held(resource.id)
        return dict(resource.attributes)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        await self._held(resource.id)


class Alive:
    async def ended(self, lock: StackLock) -> str | None:
        return None

    def link(self, run: object) -> str:
        return "http://ui/run"


def environment() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id="wf", workflow_run_id="r1")
    return env


async def prepared(backend: StateBackend) -> tuple[WorkerActivities, HeldRuntime, str | None]:
    runtime = HeldRuntime()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    acts = WorkerActivities.create(registry, backend, PriorStateCache(None, backend), Alive())
    spec = {"resources": [{"id": rid, "type": "OnPrem", "attributes": {"v": rid}} for rid in IDS]}
    request = OperationInput(project="p", workspace="w", spec=spec, auto_approve=True)
    plan = await environment().run(
        acts.prepare.prepare_operation,
        PrepareInput(operation="apply", request=request, workflow_id="wf", run_id="r1"),
    )
    return acts, runtime, plan.spec_ref


async def until(check: object, what: str) -> None:
    for _ in range(500):
        if callable(check) and check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def node_input(spec_ref: str | None, rid: str, action: str, *, watch: bool = False) -> NodeInput:
    return NodeInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=spec_ref,
        resource_id=rid,
        action=action,
        watch=watch,
    )


async def cancel_while_held(
    env: ActivityEnvironment, running: asyncio.Future[Any], runtime: HeldRuntime
) -> None:
    """Cancel the activity while its runtime calls are held; it waits for them, then ends
    cancelled once they are let go."""
    env.cancel()
    await asyncio.sleep(0.05)  # the cancel has landed; the calls are still held
    assert not running.done(), "the activity waits for the calls it started"
    runtime.release.set()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_cancelled_group_records_the_calls_it_started_and_starts_no_more(
    backend: StateBackend,
) -> None:
    acts, runtime, spec_ref = await prepared(backend)
    env = environment()
    group = GroupInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=spec_ref,
        nodes=[(rid, "Create") for rid in IDS],
        concurrency=2,
    )
    running = asyncio.ensure_future(env.run(acts.walk.run_group, group))
    await until(lambda: len(runtime.started) == 2, "two calls under way")
    await cancel_while_held(env, running, runtime)
    assert runtime.started == runtime.finished == IDS[:2], "nothing started after the cancel"
    recorded = [r.id for r in backend.get(STACK, 1).state.resources]
    assert recorded == IDS[:2]


async def test_a_cancelled_node_finishes_its_apply_and_records_it(backend: StateBackend) -> None:
    acts, runtime, spec_ref = await prepared(backend)
    env = environment()
    # with watch: the readiness wait after the record is what a cancel stops
    node = node_input(spec_ref, "r3", "Create", watch=True)
    running = asyncio.ensure_future(env.run(acts.walk.apply_resource, node))
    await until(lambda: runtime.started == ["r3"], "the apply under way")
    await cancel_while_held(env, running, runtime)
    assert runtime.finished == ["r3"]
    assert [r.id for r in backend.get(STACK, 1).state.resources] == ["r3"]


async def test_a_cancelled_delete_finishes_and_records_the_deletion(
    backend: StateBackend,
) -> None:
    acts, runtime, spec_ref = await prepared(backend)
    runtime.release.set()
    env = environment()
    for rid in ("r0", "r1"):
        await env.run(acts.walk.apply_resource, node_input(spec_ref, rid, "Create"))
    runtime.release.clear()
    env = environment()
    gone = node_input(spec_ref, "r0", "Delete")
    running = asyncio.ensure_future(env.run(acts.walk.delete_resource, gone))
    await until(lambda: runtime.started[-1:] == ["r0"] and len(runtime.started) == 3, "delete")
    await cancel_while_held(env, running, runtime)
    assert [r.id for r in backend.get(STACK, 1).state.resources] == ["r1"]


def test_the_recorded_cancel_closes_the_release_after_the_nodes_in_flight_end() -> None:
    """tests/golden/cancelled_mid_walk.json (an apply cancelled mid-walk, recorded with the
    settle-cancelled-nodes patch): a group activity was in flight when the cancel came, and
    the release's closing ``set_phase`` is scheduled only after it ended."""
    history = json.loads((GOLDEN / "cancelled_mid_walk.json").read_text())["events"]
    open_groups: set[str] = set()
    cancel_requested = closed_after_cancel = False
    for event in history:
        kind, eid = event["eventType"], event["eventId"]
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"] == "run_group":
            open_groups.add(eid)
        for ended in ("Completed", "Canceled", "Failed", "TimedOut"):
            attrs = event.get(f"activityTask{ended}EventAttributes")
            if attrs:
                open_groups.discard(attrs["scheduledEventId"])
        if kind == "EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED":
            cancel_requested = True
        if scheduled and scheduled["activityType"]["name"] == "set_phase" and cancel_requested:
            assert not open_groups, f"release closed while groups {open_groups} were running"
            closed_after_cancel = True
    assert cancel_requested and closed_after_cancel
