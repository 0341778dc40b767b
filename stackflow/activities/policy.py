"""The policy gate's activity: build the masked plan (:mod:`stackflow.policy_gate.plan_input`)
from what the preview stored, keep it in the state backend (its digest is the decision's
``input_digest``), evaluate the run's bundles with OPA (each in an evaluation of its own)
and return the decision within the byte budget (the whole one by ref when it is longer).
The decision is appended to the run's event stream (a denial is announced as
``io.stackflow.run.policy_denied``)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.activities.events import current_run, record_events
from stackflow.activities.heartbeat import heartbeating
from stackflow.activities.notify import announce
from stackflow.model.events import policy_decision
from stackflow.model.policy import DECISION_KIND, PolicyDecision
from stackflow.policy_gate.bundle import fetch_bundle
from stackflow.policy_gate.engine import Module, evaluate_apart
from stackflow.policy_gate.plan_input import INPUT_KIND, build_input, input_bytes
from stackflow.state.diff_store import load_changes
from stackflow.temporal import metrics
from stackflow.temporal.activity_io import PolicyInput


class PolicyActivities:
    def __init__(self, deps: Deps) -> None:
        self.backend = deps.backend
        self.events = deps.events
        self.specs = deps.specs
        self.plans = deps.plans
        self.cache = deps.cache

    @activity.defn(name="evaluate_policy")
    async def evaluate_policy(self, inp: PolicyInput) -> PolicyDecision:
        with temporal_errors():
            async with heartbeating("evaluate policies"):
                try:
                    decision = await asyncio.to_thread(self._evaluate, inp)
                except Exception:
                    metrics.current().policy("error", len(inp.bundles))
                    raise
            metrics.current().policy(decision.outcome.value, len(inp.bundles))
            run = current_run()
            event = policy_decision(decision.model_dump(mode="json", exclude_none=True))
            keyed = await asyncio.to_thread(record_events, self.events, inp.stack, run, [event])
            if run is not None:
                await announce(self.backend, inp.stack, run, keyed)
            return decision

    def _evaluate(self, inp: PolicyInput) -> PolicyDecision:
        body = input_bytes(self._document(inp))
        input_digest = self.backend.put_blob(INPUT_KIND, body)
        bundles = [  # each evaluated apart: a run's modules never reach the project's
            [
                Module(policy=f"{ref.scope}/{path}", source=source)
                for path, source in fetch_bundle(self.backend, ref.digest).modules.items()
            ]
            for ref in inp.bundles
        ]
        started = time.perf_counter()
        messages, policies = evaluate_apart(bundles, body)
        decision = PolicyDecision.of(
            messages,
            bundles=list(inp.bundles),
            input_digest=input_digest,
            policies=policies,
            evaluated_at=datetime.now(UTC).isoformat(),
            duration_ms=round((time.perf_counter() - started) * 1000),
        )
        brief = decision.brief(None)
        if brief is not decision:
            full = json.dumps(decision.model_dump(mode="json")).encode()
            brief = decision.brief(self.backend.put_blob(DECISION_KIND, full))
        return brief

    def _document(self, inp: PolicyInput) -> dict[str, object]:
        plan = self.plans.get(inp.plan_ref)
        spec = self.specs.get(inp.spec_ref) if inp.spec_ref else None
        node_ids = [n.id for n in plan.nodes]
        deletion_ids = [n.id for n in plan.deletions]
        types = {n.id: n.type for n in [*plan.nodes, *plan.deletions]}
        ids = [*node_ids, *deletion_ids]
        if inp.revision is not None:
            recorded = self.backend.resources(inp.stack, inp.revision, ids)
        else:  # only the plan's resources opened, not the whole prior state
            recorded = self.cache.prior_of(inp.stack, ids)
        return build_input(
            project=inp.project,
            workspace=inp.workspace,
            operation=str(inp.operation),
            spec=spec,
            node_ids=node_ids,
            deletion_ids=deletion_ids,
            types=types,
            recorded=recorded,
            changes=load_changes(self.backend, inp.diff_refs),
            requested_by=inp.requested_by,
            source=inp.source,
            now=inp.now,
        )
