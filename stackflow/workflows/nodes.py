"""Running resource nodes: one activity per node, walks of a batch, and the tally of results.

Shared by the operation workflows and the BatchWorkflow child; deterministic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from stackflow.activities.walk import WalkActivities
    from stackflow.engine.budget import short_error
    from stackflow.model.plan import PlannedNode
    from stackflow.temporal.activity_io import GroupInput, LoadBatchInput, LoadedBatch, NodeInput
    from stackflow.temporal.operation import (
        DETAIL_LIMIT,
        GROUP_LIMIT,
        BatchInput,
        BatchResult,
        NodeResult,
        NodeStatus,
    )
    from stackflow.temporal.runtime_queues import no_worker_message
    from stackflow.temporal.wire import BatchActions
    from stackflow.workflows import common, patches
    from stackflow.workflows.constants import (
        FINALIZE_ON_EVERY_EXIT,
        GROUP_READY_NODES,
        GROUP_TERRAFORM_NODES,
        PLAN_GROUPING,
        SETTLE_CANCELLED_NODES,
        WHOLE_ONPREM_GROUPS,
        WHOLE_TERRAFORM_GROUPS,
    )
    from stackflow.workflows.walker import GroupSize, WalkProgress, rounds_of_share, walk


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, ActivityError | ChildWorkflowError) and exc.cause is not None:
        exc = exc.cause
    return exc


def failure_message(exc: BaseException) -> str:
    """The innermost message of an activity/child failure: what the user needs to read."""
    inner = _innermost(exc)
    text = inner.message if isinstance(inner, ApplicationError) else str(inner)
    return short_error(text) or type(inner).__name__


def cause_type(exc: BaseException) -> str | None:
    """The class of the innermost failure (activities.errors' taxonomy)."""
    inner = _innermost(exc)
    if isinstance(inner, ApplicationError):
        return inner.type
    if isinstance(inner, CancelledError):
        return "Cancelled"
    return None


def no_worker_line(exc: BaseException, queue: str | None, served: str, wait: float) -> str | None:
    """The one line of a runtime activity no worker of ``queue`` picked up within ``wait``
    seconds (its schedule-to-start timeout), naming the queue; None for any other failure."""
    inner = _innermost(exc)
    if not queue or not isinstance(inner, ActivityTimeout):
        return None
    if inner.type != TimeoutType.SCHEDULE_TO_START:
        return None
    return no_worker_message(queue, served, wait)


def stranded_line(exc: BaseException, batch: BatchInput, type_name: str) -> str | None:
    """``no_worker_line`` of a walk's node or group (the batch carries the routing)."""
    return no_worker_line(exc, batch.queues.get(type_name), type_name, batch.queue_wait_seconds)


def raise_if_cancelled(exc: BaseException) -> None:
    """An activity or child that failed because this run is being cancelled: the run stops
    (as a cancel, so the release is closed saying so) instead of counting a failed node."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, CancelledError):
            if patches.patched(FINALIZE_ON_EVERY_EXIT):
                raise asyncio.CancelledError(str(cause) or "cancelled") from exc
            return
        cause = cause.cause if isinstance(cause, FailureError) else None


async def run_resource_node(node: PlannedNode, batch: BatchInput) -> NodeResult:
    """One activity per resource; its summary names the resource so the UI shows it."""
    method = (
        WalkActivities.delete_resource if node.action == "Delete" else WalkActivities.apply_resource
    )
    try:
        result: NodeResult = await workflow.execute_activity_method(
            method,
            NodeInput(
                project=batch.project,
                workspace=batch.workspace,
                revision=batch.revision,
                spec_ref=batch.spec_ref,
                resource_id=node.id,
                action=node.action,
                watch=batch.watch,
                force=batch.force,
                adopt=batch.adopt,
                owner=batch.owner,
                unavailable_timeout_seconds=batch.unavailable_timeout_seconds,
            ),
            **common.resource_call(
                f"{node.action} {node.id}",
                batch.queues.get(node.route_key),
                batch.queue_wait_seconds,
                settle=patches.patched(SETTLE_CANCELLED_NODES),
            ),
        )
        return result
    except ActivityError as exc:
        raise_if_cancelled(exc)
        stranded = stranded_line(exc, batch, node.route_key)
        return NodeResult(
            id=node.id,
            action=node.action,
            status=NodeStatus.failed,
            error=stranded or failure_message(exc),
            error_type="NoWorker" if stranded else cause_type(exc),
        )


async def run_resource_group(
    nodes: list[PlannedNode], batch: BatchInput, concurrency: int
) -> list[NodeResult]:
    """Ready nodes of cheap runtimes in one activity; one result per node. If the activity
    itself fails (retries spent, worker gone past its timeouts), every node fails with it."""
    verb = "delete" if nodes[0].action == "Delete" else "apply"
    try:
        results: list[NodeResult] = await workflow.execute_activity_method(
            WalkActivities.run_group,
            GroupInput(
                project=batch.project,
                workspace=batch.workspace,
                revision=batch.revision,
                spec_ref=batch.spec_ref,
                nodes=[(node.id, node.action) for node in nodes],
                concurrency=concurrency,
                force=batch.force,
                adopt=batch.adopt,
                owner=batch.owner,
                unavailable_timeout_seconds=batch.unavailable_timeout_seconds,
            ),
            **common.resource_call(
                f"{verb} {len(nodes)} resources: {nodes[0].id} …",
                batch.queues.get(nodes[0].route_key),
                batch.queue_wait_seconds,
                settle=patches.patched(SETTLE_CANCELLED_NODES),
            ),
        )
        return results
    except ActivityError as exc:
        raise_if_cancelled(exc)
        stranded = stranded_line(exc, batch, nodes[0].route_key)
        error = stranded or failure_message(exc)
        kind = "NoWorker" if stranded else cause_type(exc)
        return [
            NodeResult(
                id=node.id,
                action=node.action,
                status=NodeStatus.failed,
                error=error,
                error_type=kind,
            )
            for node in nodes
        ]


LEGACY_GROUPED = ("OnPrem", "Kubernetes")
"""The grouping of runs whose plan carries none (``OperationPlan.grouping``: runs started
before the ``grouping-from-plan`` patch), kept so their histories replay: these types' nodes
share an activity."""
LEGACY_TERRAFORM = "Terraform"
"""Grouped as well in those runs that have the ``group-terraform-nodes`` patch."""
LEGACY_TERRAFORM_LIMIT = 256
"""A Terraform group's size in those runs with the ``whole-terraform-groups`` patch."""
LEGACY_ONPREM = "OnPrem"
LEGACY_ONPREM_LIMIT = 128
LEGACY_ONPREM_ROUNDS = 32
"""An OnPrem group's size in those runs with the ``whole-onprem-groups`` patch: up to 32
nodes per call of its share of the concurrency, 128 at most."""


def group_key(
    batch: BatchInput, types: tuple[str, ...] = LEGACY_GROUPED, *, by_runtime: bool = False
) -> Callable[[PlannedNode], str | None]:
    """Nodes that may share an activity: runtimes in ``types`` (cheap ones, or Terraform,
    whose runtime runs a group's calls as one command), same kind of step, no readiness
    wait (``watch`` can take minutes per node); ``by_runtime``: one runtime per group."""

    def key(node: PlannedNode) -> str | None:
        if batch.watch or node.type not in types:
            return None
        verb = "delete" if node.action == "Delete" else "apply"
        # routed runs group per runtime: a group's activity goes to its runtime's queue
        return f"{node.route_key}/{verb}" if batch.queues or by_runtime else verb

    return key


@dataclass(frozen=True)
class Sizing:
    """How large a group of one runtime grows: ``limit`` nodes at most, and with ``rounds``
    at most that many per call of its share of the concurrency (None: the limit, whatever
    the share)."""

    limit: int
    rounds: int | None = None


def group_sizes(sizing: Mapping[str, Sizing]) -> GroupSize:
    """Groups of the runtimes in ``sizing`` grow as it says: Terraform runs a group as one
    tofu command and OnPrem as one batch, so fewer, larger groups mean fewer commands and
    activities. Other groups keep about GROUP_ROUNDS rounds of their share, GROUP_LIMIT at
    most. Keys are ``<type>/<step>`` (groups keyed by runtime)."""

    def size(key: str, share: int) -> int:
        found = sizing.get(key.partition("/")[0])
        if found is None:
            return min(GROUP_LIMIT, rounds_of_share(share))
        return found.limit if found.rounds is None else min(found.limit, found.rounds * share)

    return size


def plan_grouping(
    batch: BatchInput, nodes: list[PlannedNode]
) -> tuple[tuple[str, ...], dict[str, Sizing]]:
    """The grouped types and group sizes the run's plan carries (``OperationPlan.grouping``,
    decided by the prepare activity from each runtime's rules): groups keyed by runtime."""
    present = {n.type for n in nodes}
    sizing = {
        type_name: Sizing(found.limit or GROUP_LIMIT, found.rounds)
        for type_name, found in sorted(batch.grouping.items())
        if type_name in present and (found.limit is not None or found.rounds is not None)
    }
    return tuple(sorted(batch.grouping)), sizing


def legacy_grouping(
    grouped: bool, nodes: list[PlannedNode]
) -> tuple[tuple[str, ...], dict[str, Sizing]]:
    """The grouping of a run whose plan carries none (started before ``grouping-from-plan``),
    as its patches say."""
    types: tuple[str, ...] = LEGACY_GROUPED
    sizing: dict[str, Sizing] = {}
    terraform = grouped and any(n.type == LEGACY_TERRAFORM for n in nodes)
    if terraform and patches.patched(GROUP_TERRAFORM_NODES):
        types = (*LEGACY_GROUPED, LEGACY_TERRAFORM)
        if patches.patched(WHOLE_TERRAFORM_GROUPS):
            sizing[LEGACY_TERRAFORM] = Sizing(LEGACY_TERRAFORM_LIMIT)
    onprem = grouped and any(n.type == LEGACY_ONPREM for n in nodes)
    if onprem and patches.patched(WHOLE_ONPREM_GROUPS):
        sizing[LEGACY_ONPREM] = Sizing(LEGACY_ONPREM_LIMIT, LEGACY_ONPREM_ROUNDS)
    return types, sizing


async def walk_nodes(
    nodes: list[PlannedNode], batch: BatchInput, blocked: list[str], progress: WalkProgress
) -> list[NodeResult]:
    async def run(node: PlannedNode) -> NodeResult:
        return await run_resource_node(node, batch)

    async def run_group(group: list[PlannedNode], concurrency: int) -> list[NodeResult]:
        return await run_resource_group(group, batch, concurrency)

    grouped = patches.patched(GROUP_READY_NODES)
    if grouped and batch.grouping and patches.patched(PLAN_GROUPING):
        types, sizing = plan_grouping(batch, nodes)
        by_runtime = True
    else:
        types, sizing = legacy_grouping(grouped, nodes)
        by_runtime = bool(sizing)
    size = group_sizes(sizing) if sizing else None
    return await walk(
        nodes,
        run,
        max_concurrency=batch.max_concurrency,
        fail_fast=batch.fail_fast,
        blocked=blocked,
        progress=progress,
        run_group=run_group if grouped else None,
        group_key=group_key(batch, types, by_runtime=by_runtime) if grouped else None,
        group_limit=GROUP_LIMIT,
        group_size=size,
    )


async def load_batch_nodes(batch: BatchInput) -> LoadedBatch:
    """The nodes of a batch, from the plan store (they then live only in this history)."""
    result: LoadedBatch = await workflow.execute_activity_method(
        WalkActivities.load_batch,
        LoadBatchInput(
            plan_ref=batch.plan_ref,
            deletions=batch.deletions,
            start=batch.start,
            actions=batch.actions,
            not_ok=batch.not_ok,
        ),
        **common.store_call(f"load {BatchActions.count(batch.actions)} nodes"),
    )
    return result


def batch_indices(batch: BatchInput) -> list[int]:
    return BatchActions.indices(batch.start, batch.actions)


class Tally:
    """Walk results as a run keeps them: every result when the run has at most DETAIL_LIMIT
    nodes, else counts by status, the first DETAIL_LIMIT results that did not succeed and
    the first failure (so 30,000 results never enter a history)."""

    def __init__(self, full: bool) -> None:
        self.full = full
        self.results: list[NodeResult] = []
        self.counts: dict[str, int] = {}
        self.first_failed: NodeResult | None = None

    def wants_ids(self) -> bool:
        return self.full or len(self.results) < DETAIL_LIMIT or self.first_failed is None

    def add(self, result: NodeResult) -> None:
        key = result.status.value
        self.counts[key] = self.counts.get(key, 0) + 1
        if result.status == NodeStatus.failed and self.first_failed is None:
            self.first_failed = result
        if self.full or (
            result.status != NodeStatus.succeeded and len(self.results) < DETAIL_LIMIT
        ):
            self.results.append(result)

    def count(self, status: NodeStatus, n: int) -> None:
        self.counts[status.value] = self.counts.get(status.value, 0) + n

    def after_retry(self, again: Tally) -> Tally:
        """This tally once ``again`` (the retried nodes: every one that did not succeed)
        has run: what succeeded before stays, the rest is the retry's word."""
        merged = Tally(self.full)
        ok = NodeStatus.succeeded.value
        merged.counts = dict(again.counts)
        merged.counts[ok] = self.counts.get(ok, 0) + again.counts.get(ok, 0)
        if self.full:
            merged.results = [r for r in self.results if r.status == NodeStatus.succeeded]
            merged.results += again.results
        else:
            merged.results = list(again.results)
        merged.first_failed = again.first_failed
        return merged

    def merge(self, batch: BatchResult) -> None:
        if self.full:
            for result in batch.results:
                self.add(result)
            return
        for key, n in batch.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        if self.first_failed is None:
            self.first_failed = batch.first_failed
        room = DETAIL_LIMIT - len(self.results)
        self.results.extend(batch.results[: max(room, 0)])
