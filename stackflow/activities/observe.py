"""Activities that observe the infrastructure without changing it: refresh (read every
recorded resource, diff it against its recorded state, optionally record what changed) and
drift reports. They share the clients of :class:`OperationActivities`."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from temporalio import activity

from stackflow.activities.errors import temporal_errors
from stackflow.activities.heartbeat import heartbeating
from stackflow.diff import (
    RECORDED_SENSITIVE_KEY,
    RUNTIME_KEY_PREFIX,
    derived_sensitive_paths,
    diff_recorded,
    equal_value_paths,
    recorded_sensitive,
    sensitive_paths_for,
    sensitive_values,
)
from stackflow.diff_store import load_changes
from stackflow.drift import DriftReport, DriftSummary
from stackflow.operation import DriftRecordInput, PreviewBatchResult, RefreshBatchInput
from stackflow.runtimes.base import RuntimeOptions
from stackflow.spec import Resource
from stackflow.state.backend import RunRef

if TYPE_CHECKING:
    from stackflow.activities.operations import OperationActivities

REFRESH_PARALLELISM = 16


class ObserveActivities:
    def __init__(self, ops: OperationActivities) -> None:
        self.ops = ops
        self.backend = ops.backend

    @activity.defn(name="refresh_batch")
    async def refresh_batch(self, inp: RefreshBatchInput) -> PreviewBatchResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"refresh {inp.start}-{inp.end}"):
                return await self._refresh_batch(inp)

    async def _refresh_batch(self, inp: RefreshBatchInput) -> PreviewBatchResult:
        ops = self.ops
        assert inp.revision is not None
        plan = await asyncio.to_thread(ops.plans.get, inp.plan_ref)
        ids = [n.id for n in plan.nodes[inp.start : inp.end]]
        current = await asyncio.to_thread(
            self.backend.resources, inp.project, inp.workspace, inp.revision, ids
        )
        run = ops._owner(None) if inp.record else None
        options = ops._options(
            inp.project,
            inp.workspace,
            inp.spec_ref,
            force=False,
            adopt=False,
            revision=inp.revision,
            run=run,
        )
        gate = asyncio.Semaphore(REFRESH_PARALLELISM)

        async def one(rid: str) -> dict[str, Any]:
            recorded = current.get(rid)
            if recorded is None:  # an earlier attempt of this batch recorded it gone
                return {"id": rid, "type": "", "action": "UnChanged", "diff": []}
            async with gate:
                return await self._refresh_one(inp, recorded, options, run)

        changes = list(await asyncio.gather(*(one(rid) for rid in ids)))
        for change, rid in zip(changes, ids, strict=True):
            if not change["type"]:
                change["type"] = next(n.type for n in plan.nodes if n.id == rid)
        return await ops._batch_result(inp, changes)

    async def _refresh_one(
        self,
        inp: RefreshBatchInput,
        recorded: Resource,
        options: RuntimeOptions,
        run: RunRef | None,
    ) -> dict[str, Any]:
        from stackflow.activities.operations import _as_desired, _deletion_request, _pre_check

        ops = self.ops
        kind = str(recorded.type)
        request = _deletion_request(recorded)  # recorded attributes as the request, as deletes
        runtime = ops.registry.get(kind)
        await _pre_check(runtime, request, options)
        live = await runtime.read(request, options)
        marked = recorded_sensitive(recorded.attributes)
        sensitive = [*sensitive_paths_for(kind, recorded.attributes), *marked]
        held = [p for p in sensitive if not p.startswith(RUNTIME_KEY_PREFIX)]
        if live is not None and held:
            # what changed behind stackflow's back on a resource that holds secrets may carry
            # them (derived), and its known secrets are masked wherever they turn up now
            secrets = sensitive_values(recorded.attributes, held)
            found = derived_sensitive_paths(_as_desired(recorded.attributes), live, held)
            marked = sorted({*marked, *found, *equal_value_paths(live, secrets)})
            sensitive = [*sensitive, *marked]
        change = diff_recorded(
            recorded.id,
            kind,
            _as_desired(recorded.attributes),
            live,
            sensitive_paths=sensitive,
        )
        if inp.record and change.diff and run is not None:
            project, workspace, revision = inp.project, inp.workspace, inp.revision
            assert revision is not None
            if live is None:
                await ops._fenced(
                    run,
                    project,
                    workspace,
                    lambda: self.backend.record_deletion(
                        project, workspace, revision, recorded.id, run=run
                    ),
                )
            else:
                attributes = {**live, RECORDED_SENSITIVE_KEY: marked} if marked else dict(live)
                fresh = recorded.model_copy(update={"attributes": attributes})
                await ops._fenced(
                    run,
                    project,
                    workspace,
                    lambda: self.backend.record_resource(
                        project, workspace, revision, fresh, run=run
                    ),
                )
        return change.model_dump(mode="json")

    @activity.defn(name="record_drift")
    async def record_drift(self, inp: DriftRecordInput) -> str | None:
        """Keep the check's report (the drifted resources' masked diffs in one blob); its ref."""
        with temporal_errors():
            return await asyncio.to_thread(self._record_drift, inp)

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

    def all(self) -> list[Any]:
        return [self.refresh_batch, self.record_drift]
