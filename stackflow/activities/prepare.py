"""Preparing an operation: load (or look up) the spec, open the release for the calling run
(taking the stack lock), and plan the walk: which nodes apply, which recorded resources are
deleted, in which order. The plan goes to the state backend by ref; only a small one
travels inline."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.activities.events import record_events
from stackflow.activities.notify import announce
from stackflow.activities.stack_guard import StackGuard
from stackflow.core.errors import GraphError, NotFoundError, SpecError
from stackflow.core.refs import RunRef
from stackflow.engine.graph import Graph, build_graph, find_references, implicit_dependencies
from stackflow.engine.selection import LEFT_OUT_LIMIT, Selected, Selection, check_patterns, select
from stackflow.engine.spec import check_spec, parse_spec, parse_spec_text
from stackflow.engine.takeover import TAKES_OVER_LIMIT, taking_over
from stackflow.model.events import EventType, NewEvent
from stackflow.model.plan import PlannedNode
from stackflow.model.policy import BundleRef
from stackflow.model.release import Operation, Release
from stackflow.model.runtime_rules import rules_for
from stackflow.model.source import same_repository
from stackflow.model.spec import Resource, Spec
from stackflow.policy_gate.bundle import fetch_bundle
from stackflow.runtimes.policy import worker_policy
from stackflow.state.git_sources import git_cache, read_spec_file
from stackflow.temporal.activity_io import PrepareInput
from stackflow.temporal.operation import (
    PLAN_INLINE_LIMIT,
    TASK_QUEUE_DEFAULT,
    GroupSizing,
    OperationInput,
    OperationPlan,
    check_request,
)
from stackflow.temporal.runtime_queues import plan_queues, queue_wait, route, runtime_queues

GATED = (Operation.apply, Operation.destroy, Operation.rollback)
"""Operations with a walk that the policy gate judges (and preview, which shows it)."""


def plan_grouping(types: Iterable[str]) -> dict[str, GroupSizing]:
    """The grouping a plan carries: each of its types whose runtime is grouped
    (``RuntimeRules.grouped``) -> how large its groups grow (``RuntimeRules.grouping``)."""
    out: dict[str, GroupSizing] = {}
    for type_name in sorted(set(types)):
        rules = rules_for(type_name)
        if rules is not None and rules.grouped:
            sizing = rules.grouping
            out[type_name] = GroupSizing(limit=sizing.limit, rounds=sizing.rounds)
    return out


def pin(nodes: list[PlannedNode], resources: Mapping[str, Resource]) -> None:
    """Each node whose place (an OnPrem host) the worker's routing pins to a task queue of
    its own routed there (``PlannedNode.route``)."""
    main = activity.info().task_queue if activity.in_activity() else TASK_QUEUE_DEFAULT
    queues = runtime_queues(main)
    if not any("@" in key for key in queues):
        return
    for node in nodes:
        rules = rules_for(node.type)
        if rules is not None and node.id in resources:
            place = rules.place(resources[node.id].attributes)
            node.route = route(node.type, place, queues)


def planned(graph: Graph, types: Mapping[str, str], reverse: bool = False) -> list[PlannedNode]:
    """Nodes in walk order; for deletes, a node waits for its dependents instead."""
    if reverse:
        order = graph.reverse_topological_order()
        return [PlannedNode(id=i, type=types[i], deps=graph.dependents(i)) for i in order]
    order = graph.topological_order()
    return [PlannedNode(id=i, type=types[i], deps=graph.dependencies(i)) for i in order]


def deletion_graph(resources: list[Resource]) -> tuple[Graph, dict[str, str]]:
    """The recorded resources' graph (edges to resources not listed drop) and their types.

    Implicit edges (a File inside a recorded Directory) are derived again from the recorded
    attributes, so releases recorded before a rule existed are deleted in its order too,
    unless that would close a cycle with recorded edges."""
    ids = {r.id for r in resources}
    deps = {r.id: [d for d in r.depends_on if d in ids] for r in resources}
    types = {r.id: str(r.type) for r in resources}
    implicit = implicit_dependencies(resources)
    if implicit:
        try:
            return Graph.from_dependencies(
                {rid: [*found, *implicit.get(rid, ())] for rid, found in deps.items()}
            ), types
        except GraphError:
            pass
    return Graph.from_dependencies(deps), types


class PrepareActivities:
    def __init__(self, deps: Deps, guard: StackGuard) -> None:
        self.backend = deps.backend
        self.events = deps.events
        self.specs = deps.specs
        self.plans = deps.plans
        self.guard = guard

    @activity.defn(name="prepare_operation")
    async def prepare_operation(self, inp: PrepareInput) -> OperationPlan:
        with temporal_errors():
            plan = await self._prepare(inp)
            request = inp.request
            start = NewEvent(
                type=EventType.run_start,
                key="run_start",
                data={
                    "operation": inp.operation.value,
                    "project": request.project,
                    "workspace": request.workspace,
                    "revision": plan.revision,
                    "requested_by": request.operator,
                    "total": plan.node_count + plan.deletion_count,
                },
            )
            run = RunRef(inp.workflow_id, inp.run_id)
            keyed = await asyncio.to_thread(record_events, self.events, request.stack, run, [start])
            await announce(self.backend, request.stack, run, keyed)
            return plan

    async def _prepare(self, inp: PrepareInput) -> OperationPlan:
        request = inp.request
        check_request(request)
        spec: Spec | None
        ref: str | None
        operation = inp.operation
        if operation == Operation.drift:
            return await asyncio.to_thread(self._prepare_drift, request)
        if operation == Operation.rollback:
            spec, ref = await asyncio.to_thread(self._rollback_spec, request)
        else:
            spec, ref = await asyncio.to_thread(self._load_spec, inp)
        selection = Selection(targets=request.targets, excludes=request.excludes)
        if operation == Operation.preview:
            assert spec is not None
            plan = await asyncio.to_thread(self._prepare_preview, inp, spec, ref, selection)
            plan.policies = await asyncio.to_thread(self._policies, request)
            return plan
        run = RunRef(inp.workflow_id, inp.run_id)
        if operation in (Operation.destroy, Operation.refresh):
            ref = await asyncio.to_thread(self.backend.latest_spec_ref, request.stack)
        release = await self.guard.open_release(
            request.stack,
            operation,
            ref,
            run,
            source_revision=request.to_revision if operation == Operation.rollback else None,
            source=request.source if operation in (Operation.apply, Operation.preview) else None,
            set_run=request.set_run,
        )
        plan = await asyncio.to_thread(self._prepare_walk, operation, spec, ref, release, selection)
        plan.four_eyes = worker_policy().approvals.four_eyes_for(request.project)
        if request.source is not None and spec is not None:
            # a git commit's spec, never read by the API: what it takes over is approved
            # by an approver, whatever the run's auto_approve (workflows.gate)
            found = taking_over(spec.resources)
            plan.takes_over = [rid for rid, _ in found[:TAKES_OVER_LIMIT]]
        if operation in GATED:
            plan.policies = await asyncio.to_thread(self._policies, request)
        return plan

    def _policies(self, request: OperationInput) -> list[BundleRef]:
        """The bundles the run evaluates: its project's (pushed), then its own."""
        found = []
        binding = self.backend.policy_of(request.project)
        if binding is not None:
            found.append(BundleRef(scope="project", digest=binding.digest))
        if request.policy_ref is not None:
            fetch_bundle(self.backend, request.policy_ref)  # SpecError: missing, or not one
            found.append(BundleRef(scope="run", digest=request.policy_ref))
        return found

    def _load_spec(self, inp: PrepareInput) -> tuple[Spec | None, str | None]:
        request = inp.request
        if request.spec is not None:
            spec = parse_spec(request.spec, source="input.spec")
            return spec, self.specs.put(spec)
        if request.spec_ref is not None:
            spec = self.specs.get(request.spec_ref)
            check_spec(spec, request.spec_ref)  # stored by whoever started the run
            return spec, request.spec_ref
        if request.source is not None:
            text = read_spec_file(request.source, git_cache(), self._bound_branch(request))
            where = f"{request.source.path}@{request.source.commit[:12]}"
            spec = parse_spec_text(text, where)
            return spec, self.specs.put(spec)
        return None, None

    def _bound_branch(self, request: OperationInput) -> str | None:
        """The branch the stack's git source is bound to, when the run reads that
        repository: a fetch takes that ref only (None: the commit alone, by its id)."""
        bound = self.backend.source_of(request.stack)
        source = request.source
        if bound is None or source is None or not same_repository(bound.url, source.url):
            return None
        return bound.ref

    def _rollback_spec(self, request: OperationInput) -> tuple[Spec, str]:
        """The spec of release ``to_revision``: it must exist, be an apply (or rollback) and
        still have its spec."""
        stack = request.stack
        n = request.to_revision
        if n is None:
            raise SpecError("rollback: to_revision is required (the release to restore)")
        try:
            source = self.backend.get(stack, n, with_spec=False)
        except NotFoundError:
            known = self.backend.revisions(stack)
            raise NotFoundError(
                f"rollback --to {n}: {stack} has no release {n}"
                + (f" (its releases are {known[0]}..{known[-1]})" if known else " (none yet)")
            ) from None
        if source.operation in (Operation.destroy, Operation.refresh):
            raise SpecError(
                f"rollback --to {n}: release {n} of {stack} is a {source.operation}, not an "
                "apply; roll back to a release that applied a spec"
            )
        if source.spec_ref is None:
            raise NotFoundError(
                f"rollback --to {n}: release {n} of {stack} has no spec (imported without one)"
            )
        try:
            return self.specs.get(source.spec_ref), source.spec_ref
        except NotFoundError:
            raise NotFoundError(
                f"rollback --to {n}: the spec of release {n} of {stack} "
                f"({source.spec_ref}) is gone from the state backend"
            ) from None

    def _prepare_drift(self, request: OperationInput) -> OperationPlan:
        """The last spec against the latest release's state, limited to the resources that
        state records (no lock, no release): what a drift check previews."""
        stack = request.stack
        revisions = self.backend.revisions(stack)
        if not revisions:
            raise NotFoundError(f"drift: stack {stack} has no releases; apply it first")
        latest = self.backend.get(stack, revisions[-1], with_spec=False, with_state=False)
        ref = self.backend.latest_spec_ref(stack)
        recorded = set(self.backend.resource_ids(stack, latest.revision))
        if ref is None or latest.operation == Operation.destroy:
            spec = Spec(resources=[])
        else:
            spec = self.specs.get(ref)
        return self._plan(spec, ref, latest.revision, {}, Selection(), only=recorded)

    def _prepare_preview(
        self, inp: PrepareInput, spec: Spec, ref: str | None, selection: Selection
    ) -> OperationPlan:
        """The plan of ``spec`` over the latest release's state, of which it reads only the
        resources the spec no longer has (those it plans to delete), in the state's order: a
        large unchanged stack's state is never read whole here."""
        stack = inp.request.stack
        revisions = self.backend.revisions(stack)
        gone: dict[str, Resource] = {}
        if revisions:
            kept = {r.id for r in spec.resources}
            ids = [i for i in self.backend.resource_ids(stack, revisions[-1]) if i not in kept]
            found = self.backend.resources(stack, revisions[-1], ids)
            gone = {i: found[i] for i in ids if i in found}
        return self._plan(spec, ref, None, gone, selection)

    def _prepare_walk(
        self,
        operation: Operation,
        spec: Spec | None,
        ref: str | None,
        release: Release,
        selection: Selection,
    ) -> OperationPlan:
        state = {r.id: r for r in release.state.resources}
        if operation in (Operation.destroy, Operation.refresh):
            graph, types = deletion_graph(list(state.values()))
            check_patterns(selection, graph.ids)
            chosen = select(graph, selection, deleting=operation == Operation.destroy)
            nodes = [n for n in planned(graph, types, reverse=True) if n.id in chosen.kept]
            pin(nodes, state)
            if operation == Operation.refresh:
                return self._store_plan(ref, release.revision, nodes, [], chosen)
            return self._store_plan(ref, release.revision, [], nodes, chosen)
        assert spec is not None
        return self._plan(spec, ref, release.revision, state, selection)

    def _plan(
        self,
        spec: Spec,
        ref: str | None,
        revision: int | None,
        state: Mapping[str, Resource],
        selection: Selection,
        only: set[str] | None = None,
    ) -> OperationPlan:
        """The walk plan of ``spec`` over ``state`` (``only``: just these spec resources)."""
        graph = build_graph(spec)
        types = {r.id: str(r.type) for r in spec.resources}
        gone_graph, gone_types = deletion_graph([r for r in state.values() if r.id not in types])
        check_patterns(selection, [*graph.ids, *gone_graph.ids])
        chosen = select(graph, selection)
        gone = select(gone_graph, selection, deleting=True)
        nodes = [
            n
            for n in planned(graph, types)
            if n.id in chosen.kept and (only is None or n.id in only)
        ]
        by_id = {r.id: r for r in spec.resources}
        for node in nodes:
            refs = find_references(by_id[node.id].attributes, types)
            node.refs = sorted({(ref.resource_id, ref.path) for ref in refs})
        deletions = [n for n in planned(gone_graph, gone_types, reverse=True) if n.id in gone.kept]
        pin(nodes, by_id)
        pin(deletions, state)
        left = Selected(
            kept=chosen.kept | gone.kept,
            left_out=[*chosen.left_out, *gone.left_out][:LEFT_OUT_LIMIT],
            left_out_count=chosen.left_out_count + gone.left_out_count,
        )
        return self._store_plan(ref, revision, nodes, deletions, left)

    def _store_plan(
        self,
        spec_ref: str | None,
        revision: int | None,
        nodes: list[PlannedNode],
        deletions: list[PlannedNode],
        selected: Selected | None = None,
    ) -> OperationPlan:
        """Store the plan; return its ref, its size, its routing and, when small, the plan
        itself."""
        inline = len(nodes) + len(deletions) <= PLAN_INLINE_LIMIT
        main = activity.info().task_queue if activity.in_activity() else TASK_QUEUE_DEFAULT
        return OperationPlan(
            queues=plan_queues((n.route_key for n in [*nodes, *deletions]), runtime_queues(main)),
            grouping=plan_grouping(n.type for n in [*nodes, *deletions]),
            queue_wait_seconds=queue_wait(),
            spec_ref=spec_ref,
            plan_ref=self.plans.put(nodes, deletions),
            revision=revision,
            node_count=len(nodes),
            deletion_count=len(deletions),
            inline=inline,
            nodes=nodes if inline else [],
            deletions=deletions if inline else [],
            left_out=selected.left_out if selected else [],
            left_out_count=selected.left_out_count if selected else 0,
        )
