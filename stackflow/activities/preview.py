"""Previewing: what each node of a plan would change (a batch of nodes per activity, read
side by side), the details the workflow shows, and one ref standing for a run's diffs.

A batch returns compact codes (one action code and flags per node), the first details within
the byte budget, and the whole masked diff in the state backend by ref."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.activities.events import current_run, planned_changes, record_events
from stackflow.activities.heartbeat import heartbeating
from stackflow.activities.resource_step import (
    COALESCED_PARALLELISM,
    ResourceStep,
    desired_from_recorded,
    referenced_ids,
)
from stackflow.activities.stack_guard import read_scope_key
from stackflow.engine.budget import BUDGET, compact_change, fit_changes
from stackflow.engine.diff import Action, Change, FieldChange
from stackflow.engine.masking import SecretSet
from stackflow.model.plan import PlannedNode
from stackflow.model.spec import Resource
from stackflow.runtimes import guard
from stackflow.runtimes.base import read_scope
from stackflow.state.diff_store import put_changes, put_index
from stackflow.state.protocols import BlobStore
from stackflow.temporal.activity_io import (
    DescribeInput,
    DiffIndexInput,
    PreviewBatchInput,
    PreviewBatchResult,
)
from stackflow.temporal.operation import references_entry
from stackflow.temporal.wire import ChangeFlags, encode_change

PREVIEW_PARALLELISM = 16


async def batch_result(
    backend: BlobStore,
    inp: PreviewBatchInput,
    changes: list[Change],
) -> PreviewBatchResult:
    """Changes as a preview (or refresh) batch returns them: codes, the first details within
    the byte budget, the whole diff in the backend by ref."""
    result = PreviewBatchResult()
    codes = []
    for change in changes:
        flags = ChangeFlags.unrecorded if change.unrecorded else ChangeFlags.none
        if change.drift:
            flags |= ChangeFlags.drift
        if inp.with_diff:
            result.details.append(compact_change(change))
        elif change.diff:
            flags |= ChangeFlags.diff_omitted
        codes.append(encode_change(change.action, flags))
    result.codes = "".join(codes)
    if any(change.diff for change in changes):
        # The whole diff (every field, whole values; sensitive ones already masked)
        # goes to the backend; history gets the shortened one, within the byte budget.
        result.diff_ref = await asyncio.to_thread(put_changes, backend, changes)
    result.details = fit_changes(result.details, BUDGET // 2)
    return result


def owned(nodes: list[PlannedNode], runtimes: list[str] | None) -> list[int]:
    """Offsets of the nodes a batch for ``runtimes`` previews (every one when None)."""
    return [i for i, node in enumerate(nodes) if runtimes is None or node.route_key in runtimes]


class PreviewActivities:
    def __init__(self, deps: Deps, step: ResourceStep) -> None:
        self.registry = deps.registry
        self.backend = deps.backend
        self.events = deps.events
        self.specs = deps.specs
        self.plans = deps.plans
        self.cache = deps.cache
        self.step = step

    @activity.defn(name="preview_batch")
    async def preview_batch(self, inp: PreviewBatchInput) -> PreviewBatchResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"preview {inp.start}-{inp.end}"):
                return await self._preview_batch(inp)

    async def _preview_batch(self, inp: PreviewBatchInput) -> PreviewBatchResult:
        plan = await asyncio.to_thread(self.plans.get, inp.plan_ref)
        nodes = plan.nodes[inp.start : inp.end]
        deletions = plan.deletions[inp.start : inp.end]
        own, own_deleted = owned(nodes, inp.runtimes), owned(deletions, inp.runtimes)
        ids = [nodes[i].id for i in own]
        delete_ids = [deletions[i].id for i in own_deleted]
        sizes = (len(plan.nodes) + len(plan.deletions), len(nodes) + len(deletions))
        changes = await self._preview_changes(inp, ids, delete_ids, sizes)
        await asyncio.to_thread(
            record_events, self.events, inp.stack, current_run(), planned_changes(changes)
        )
        result = await batch_result(self.backend, inp, changes)
        for position, offset in enumerate(own):
            node = nodes[offset]
            if node.refs and changes[position].action is Action.UnChanged:
                result.refs.extend(
                    (inp.start + offset, plan.node_index[rid], path)
                    for rid, path in node.refs
                    if rid in plan.node_index
                )
        if inp.runtimes is None:
            return result
        positions = [*own, *(len(nodes) + i for i in own_deleted)]
        return result.spread(positions, len(nodes) + len(deletions))

    async def _preview_changes(
        self,
        inp: PreviewBatchInput,
        ids: list[str],
        delete_ids: list[str],
        sizes: tuple[int, int],
    ) -> list[Change]:
        """``sizes``: the resources of the run's plan, and of this batch's slice of it."""
        resources = (
            await asyncio.to_thread(self.specs.resources, inp.spec_ref) if inp.spec_ref else {}
        )
        # what the batch reads of the prior state: its own resources and what they reference
        # (not the whole state, once per batch)
        needed = [*ids, *delete_ids]
        needed += (r for i in ids for r in referenced_ids(resources[i], resources))
        prior = await asyncio.to_thread(self.cache.prior_of, inp.stack, needed)
        current: Mapping[str, Resource]
        if inp.revision is not None:
            current = await asyncio.to_thread(
                self.backend.resources, inp.stack, inp.revision, [*ids, *delete_ids]
            )
        else:
            current = prior
        step = self.step
        options = step.options(
            inp.stack,
            inp.spec_ref,
            force=inp.force,
            adopt=inp.adopt,
            preview_of=await self._applying(inp),
        )
        # The worker policy, before any runtime call: the whole spec, then this batch.
        deleting = [
            current[i].model_copy(
                update={"attributes": desired_from_recorded(current[i].attributes)}
            )
            for i in delete_ids
        ]
        batch = [*(resources[i] for i in ids), *deleting]
        await asyncio.to_thread(
            guard.check_preview, self.registry, inp.spec_ref, resources, batch, options
        )
        stack_secrets = await asyncio.to_thread(step.secrets.of, inp.stack) if ids else SecretSet()
        gate = asyncio.Semaphore(PREVIEW_PARALLELISM)
        merged = asyncio.Semaphore(COALESCED_PARALLELISM)

        def gate_for(resource_id: str, deleting: bool) -> asyncio.Semaphore:
            found = current[resource_id] if deleting else resources[resource_id]
            runtime = self.registry.find(str(found.type))
            return merged if runtime is not None and runtime.coalesces_calls else gate

        async def one(resource_id: str, deleting: bool) -> Change:
            async with gate_for(resource_id, deleting):
                if deleting:
                    return await step.preview_delete(current[resource_id], prior, options)
                return await step.preview_apply(
                    resources[resource_id],
                    resources,
                    prior,
                    current,
                    options,
                    inp.ignore_fields,
                    stack_secrets,
                )

        # one read scope: a runtime may answer many reads of one kind and place from one
        # listing, kept as a snapshot for the run's later preview batches
        run_size, span = sizes
        with read_scope(
            read_scope_key(), (r.attributes for r in batch), run_size=run_size, span=span
        ):
            jobs = [one(i, False) for i in ids] + [one(i, True) for i in delete_ids]
            return list(await asyncio.gather(*jobs))

    async def _applying(self, inp: PreviewBatchInput) -> int | None:
        """The release this preview's apply will make (a run's release not yet final; a
        drift check previews a final one), or None."""
        if inp.revision is None:
            return None
        phase = await asyncio.to_thread(self.backend.phase_of, inp.stack, inp.revision)
        return None if phase.is_final else inp.revision

    @activity.defn(name="describe_changes")
    async def describe_changes(self, inp: DescribeInput) -> list[dict[str, Any]]:
        with temporal_errors():
            return await asyncio.to_thread(self._describe, inp)

    def _describe(self, inp: DescribeInput) -> list[dict[str, Any]]:
        plan = self.plans.get(inp.plan_ref)
        described = []
        for item in inp.items:
            node = plan.of(item.line.deletion)[item.plan_index]
            flags = ChangeFlags(item.flags)
            change = Change(
                id=node.id,
                type=node.type,
                action=Action(item.action),
                drift=bool(flags & ChangeFlags.drift),
            )
            if item.ref_index >= 0:
                rid = plan.nodes[item.ref_index].id
                moved = f"{rid}.{item.ref_path}" if item.ref_path else rid
                change.diff = [FieldChange.model_validate(references_entry(moved))]
            omitted = bool(flags & ChangeFlags.diff_omitted)
            described.append(compact_change(change, diff_omitted=omitted))
        return described

    @activity.defn(name="index_diffs")
    async def index_diffs(self, inp: DiffIndexInput) -> str:
        """One ref standing for a run's diff refs (the workflow holds a few, whatever the
        size of the stack)."""
        with temporal_errors():
            return await asyncio.to_thread(put_index, self.backend, inp.refs)
