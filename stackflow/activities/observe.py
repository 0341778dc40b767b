"""Activities that observe the infrastructure without changing it: refresh (read every
recorded resource, diff it against its recorded state, optionally record what changed) and
drift reports."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.activities.events import current_run, planned_changes, record_events
from stackflow.activities.heartbeat import heartbeating
from stackflow.activities.notify import drift_notice, send_notices
from stackflow.activities.preview import batch_result, owned
from stackflow.activities.resource_step import ResourceStep, desired_from_recorded
from stackflow.activities.stack_guard import StackGuard, calling_run
from stackflow.core.refs import RunRef
from stackflow.engine.diff import Action, Change, diff_recorded
from stackflow.engine.masking import (
    RECORDED_SENSITIVE_KEY,
    RUNTIME_KEY_PREFIX,
    derived_sensitive_paths,
    equal_value_paths,
    recorded_sensitive,
    sensitive_paths_for,
    sensitive_values,
)
from stackflow.model.drift import DriftReport, DriftSummary
from stackflow.model.spec import Resource
from stackflow.runtimes.base import RuntimeOptions
from stackflow.state.diff_store import load_changes
from stackflow.temporal.activity_io import DriftRecordInput, PreviewBatchResult, RefreshBatchInput

REFRESH_PARALLELISM = 16


class ObserveActivities:
    def __init__(self, deps: Deps, guard: StackGuard, step: ResourceStep) -> None:
        self.backend = deps.backend
        self.events = deps.events
        self.plans = deps.plans
        self.guard = guard
        self.step = step

    @activity.defn(name="refresh_batch")
    async def refresh_batch(self, inp: RefreshBatchInput) -> PreviewBatchResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"refresh {inp.start}-{inp.end}"):
                return await self._refresh_batch(inp)

    async def _refresh_batch(self, inp: RefreshBatchInput) -> PreviewBatchResult:
        assert inp.revision is not None
        plan = await asyncio.to_thread(self.plans.get, inp.plan_ref)
        nodes = plan.nodes[inp.start : inp.end]
        own = owned(nodes, inp.runtimes)
        ids = [nodes[i].id for i in own]
        current = await asyncio.to_thread(self.backend.resources, inp.stack, inp.revision, ids)
        run = calling_run() if inp.record else None
        options = self.step.options(
            inp.stack,
            inp.spec_ref,
            force=False,
            adopt=False,
            revision=inp.revision,
            run=run,
        )
        gate = asyncio.Semaphore(REFRESH_PARALLELISM)

        types = {n.id: n.type for n in plan.nodes[inp.start : inp.end]}

        async def one(rid: str) -> Change:
            recorded = current.get(rid)
            if recorded is None:  # an earlier attempt of this batch recorded it gone
                return Change(id=rid, type=types[rid], action=Action.UnChanged)
            async with gate:
                return await self._refresh_one(inp, recorded, options, run)

        changes = list(await asyncio.gather(*(one(rid) for rid in ids)))
        if not inp.record:
            await asyncio.to_thread(
                record_events, self.events, inp.stack, current_run(), planned_changes(changes)
            )
        result = await batch_result(self.backend, inp, changes)
        return result if inp.runtimes is None else result.spread(own, len(nodes))

    async def _refresh_one(
        self,
        inp: RefreshBatchInput,
        recorded: Resource,
        options: RuntimeOptions,
        run: RunRef | None,
    ) -> Change:
        kind = str(recorded.type)
        # recorded attributes as the request, as deletes
        live = await self.step.read_recorded(recorded, options)
        marked = recorded_sensitive(recorded.attributes)
        sensitive = [*sensitive_paths_for(kind, recorded.attributes), *marked]
        held = [p for p in sensitive if not p.startswith(RUNTIME_KEY_PREFIX)]
        desired = desired_from_recorded(recorded.attributes)
        if live is not None and held:
            # what changed behind stackflow's back on a resource that holds secrets may carry
            # them (derived), and its known secrets are masked wherever they turn up now
            secrets = sensitive_values(recorded.attributes, held)
            found = derived_sensitive_paths(desired, live, held)
            marked = sorted({*marked, *found, *equal_value_paths(live, secrets)})
            sensitive = [*sensitive, *marked]
        change = diff_recorded(recorded.id, kind, desired, live, sensitive_paths=sensitive)
        if inp.record and change.diff and run is not None:
            await self._record(inp, run, recorded, live, marked)
        return change

    async def _record(
        self,
        inp: RefreshBatchInput,
        run: RunRef,
        recorded: Resource,
        live: dict[str, Any] | None,
        marked: list[str],
    ) -> None:
        """What a refresh found, recorded as the run that holds the stack."""
        stack, revision = inp.stack, inp.revision
        assert revision is not None
        if live is None:
            await self.guard.write(
                run,
                stack,
                lambda: self.backend.record_deletion(stack, revision, recorded.id, run=run),
            )
            return
        attributes = {**live, RECORDED_SENSITIVE_KEY: marked} if marked else dict(live)
        fresh = recorded.model_copy(update={"attributes": attributes})
        await self.guard.write(
            run,
            stack,
            lambda: self.backend.record_resource(stack, revision, fresh, run=run),
        )

    @activity.defn(name="record_drift")
    async def record_drift(self, inp: DriftRecordInput) -> str | None:
        """Keep the check's report (the drifted resources' masked diffs in one blob); its ref.
        Drift found is announced (``io.stackflow.run.drift_detected``)."""
        with temporal_errors():
            ref = await asyncio.to_thread(self._record_drift, inp)
            summary = DriftSummary.model_validate(inp.summary)
            if summary.drifted or summary.missing:
                data = {
                    "revision": inp.revision,
                    "summary": summary.model_dump(mode="json"),
                    "repair_workflow_id": inp.repair_workflow_id,
                }
                run = RunRef(inp.workflow_id, inp.run_id)
                await send_notices(self.backend, inp.stack, [drift_notice(inp.stack, run, data)])
            return ref

    def _record_drift(self, inp: DriftRecordInput) -> str | None:
        drifted = [c for c in load_changes(self.backend, inp.diff_refs) if c.get("drift")]
        report_ref = None
        if drifted:
            body = json.dumps(drifted, separators=(",", ":"), default=str).encode()
            report_ref = self.backend.put_blob("drift_report", body)
        summary = DriftSummary.model_validate(inp.summary)
        self.backend.put_drift_report(
            DriftReport(
                project=inp.project,
                workspace=inp.workspace,
                checked_at=datetime.fromisoformat(inp.checked_at),
                revision=inp.revision,
                drifted=bool(summary.drifted or summary.missing),
                summary=summary,
                report_ref=report_ref,
                workflow_id=inp.workflow_id,
                run_id=inp.run_id,
                repair_workflow_id=inp.repair_workflow_id,
            )
        )
        return report_ref
