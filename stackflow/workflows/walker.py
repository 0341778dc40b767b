"""The DAG walker shared by apply, destroy and batch workflows.

Deterministic by construction: the ready set is a list kept in plan order, completions are
handled in id order, and no set is iterated to decide what runs next. A node starts when all
of its dependencies succeeded; a failed node's dependents are skipped while independent
branches go on (``fail_fast`` stops starting new nodes instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.model.plan import PlannedNode
    from stackflow.temporal.operation import NodeResult, NodeStatus
    from stackflow.workflows import patches
    from stackflow.workflows.constants import CANCEL_IN_FLIGHT, SETTLE_CANCELLED_NODES

GROUP_ROUNDS = 8
"""A group holds at most this many nodes per runtime call it may make at once."""
RunNode = Callable[[PlannedNode], Awaitable[NodeResult]]
RunGroup = Callable[[list[PlannedNode], int], Awaitable[list[NodeResult]]]
"""Runs a group of nodes, at most the given number of runtime calls at once."""
GroupSize = Callable[[str, int], int]
"""The most nodes a group of a key takes, given its share of the concurrency."""


def rounds_of_share(share: int) -> int:
    """About GROUP_ROUNDS rounds of the group's share: progress still moves in small steps."""
    return GROUP_ROUNDS * share


class WalkProgress:
    """Live counters the status query reads while a walk runs; ``on_change`` (if set) is
    told after each batch of completions (it refreshes what the UI shows)."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.done = 0
        self.failed = 0
        self.running: list[str] = []
        self.on_change = on_change
        self.started: datetime | None = None
        """Workflow time the walk started (set by the operation), for the ETA."""

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def eta_seconds(self, now: datetime, total: int) -> float | None:
        """Seconds left at the rate nodes finished so far (None before the first one)."""
        if self.started is None or self.done <= 0 or total <= self.done:
            return None if total > self.done else 0.0
        elapsed = (now - self.started).total_seconds()
        return max(0.0, elapsed / self.done * (total - self.done))


async def walk(
    nodes: Sequence[PlannedNode],
    run_node: RunNode,
    *,
    max_concurrency: int,
    fail_fast: bool = False,
    blocked: Sequence[str] = (),
    progress: WalkProgress | None = None,
    run_group: RunGroup | None = None,
    group_key: Callable[[PlannedNode], str | None] | None = None,
    group_limit: int = 64,
    group_size: GroupSize | None = None,
) -> list[NodeResult]:
    """Run every node after its dependencies; return one result per node, in plan order.

    With ``run_group``, ready nodes that share a ``group_key`` (None: never grouped) start
    together in one call (one activity, up to ``group_limit`` nodes) instead of one call
    each: as many as ``group_size`` says for the key, by default about GROUP_ROUNDS rounds of
    its share and never more than ``group_limit``.
    ``max_concurrency`` bounds the runtime calls in flight either way: a group may make at
    most half of them at once, so two groups overlap (one runs while the other's result
    travels back)."""
    progress = progress or WalkProgress()
    order = {node.id: i for i, node in enumerate(nodes)}
    by_id = {node.id: node for node in nodes}
    blocked_ids = dict.fromkeys(blocked)
    remaining: dict[str, int] = {}
    dependents: dict[str, list[str]] = {node.id: [] for node in nodes}
    results: dict[str, NodeResult] = {}

    def skip(node_id: str, reason: str) -> None:
        stack = [node_id]
        while stack:
            current = stack.pop()
            if current in results:
                continue
            node = by_id[current]
            results[current] = NodeResult(
                id=current, action=node.action, status=NodeStatus.skipped, error=reason
            )
            progress.done += 1
            stack.extend(dependents[current])

    for node in nodes:
        inside = [dep for dep in node.deps if dep in by_id]
        remaining[node.id] = len(inside)
        for dep in inside:
            dependents[dep].append(node.id)
    for node in nodes:
        bad = [dep for dep in node.deps if dep in blocked_ids]
        if bad:
            skip(node.id, f"dependency {bad[0]} did not succeed")

    ready = [node.id for node in nodes if remaining[node.id] == 0 and node.id not in results]
    in_flight: dict[asyncio.Task[list[NodeResult]], list[str]] = {}
    slots: dict[asyncio.Task[list[NodeResult]], int] = {}
    """Runtime calls a task may make at once: 1 per node, a group its share."""
    flying = 0
    group_slots = max(1, max_concurrency // 2)
    stopping = False

    async def single(node: PlannedNode) -> list[NodeResult]:
        return [await run_node(node)]

    def take(share: int) -> list[str]:
        """The next ready node, and the ready nodes of its group (up to its size)."""
        first = ready.pop(0)
        key = group_key(by_id[first]) if run_group is not None and group_key else None
        if key is None:
            return [first]
        limit = group_size(key, share) if group_size else min(group_limit, rounds_of_share(share))
        picked = [first]
        for node_id in list(ready):
            if len(picked) >= limit:
                break
            if group_key is not None and group_key(by_id[node_id]) == key:
                ready.remove(node_id)
                picked.append(node_id)
        return picked

    def running() -> list[str]:
        return sorted((i for ids in in_flight.values() for i in ids), key=order.__getitem__)

    while ready or in_flight:
        while ready and not stopping and flying < max_concurrency:
            share = min(group_slots, max_concurrency - flying)
            ids = take(share)
            if len(ids) == 1:
                task = asyncio.ensure_future(single(by_id[ids[0]]))
                slots[task] = 1
            else:
                assert run_group is not None
                share = min(len(ids), share)
                task = asyncio.ensure_future(run_group([by_id[i] for i in ids], share))
                slots[task] = share
            in_flight[task] = ids
            flying += slots[task]
            progress.running = running()
        if not in_flight:
            break
        try:
            finished, _ = await workflow.wait(list(in_flight), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The run is being cancelled: so are the nodes in flight (their activities get
            # a cancel request) rather than finishing after the release was closed.
            if patches.patched(CANCEL_IN_FLIGHT):
                for task in in_flight:
                    task.cancel()
                if patches.patched(SETTLE_CANCELLED_NODES):
                    # each finishes the runtime calls it started and records them first
                    await asyncio.gather(*in_flight, return_exceptions=True)
            raise
        newly_ready: list[str] = []
        done: list[tuple[str, NodeResult]] = []
        for task in finished:
            ids = in_flight.pop(task)
            flying -= slots.pop(task)
            done.extend(zip(ids, task.result(), strict=True))
        for node_id, result in sorted(done, key=lambda pair: order[pair[0]]):
            results[node_id] = result
            progress.done += 1
            if result.status == NodeStatus.succeeded:
                for child in dependents[node_id]:
                    remaining[child] -= 1
                    if remaining[child] == 0 and child not in results:
                        newly_ready.append(child)
            else:
                progress.failed += 1
                for child in dependents[node_id]:
                    skip(child, f"dependency {node_id} did not succeed")
                if fail_fast:
                    stopping = True
        ready.extend(newly_ready)
        ready.sort(key=order.__getitem__)
        progress.running = running()
        progress.changed()

    for node in nodes:
        if node.id not in results:
            skip(node.id, "not started: an earlier node failed and fail_fast is set")
    return [results[node.id] for node in nodes]
