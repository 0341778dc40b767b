"""The activities of the operation workflows: all I/O lives here.

Thin adapters: load the spec by ref, read prior state (Redis, then the store), call the
runtime, write state. Each one is idempotent (apply is declarative, deleting a missing
object succeeds, release writes are compare-and-swap), and returns a small summary: the
full live state goes to the release store, never into workflow history.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Container, Iterable, Mapping
from typing import Any

from temporalio import activity

from activities.errors import temporal_errors
from activities.heartbeat import heartbeating
from activities.state import ReleaseStateReader
from runtimes.base import ResourceRequest, RuntimeOptions
from runtimes.registry import RuntimeRegistry
from stackflow.cache import PriorStateCache
from stackflow.diff import diff_resource, sensitive_paths_for
from stackflow.errors import SpecError
from stackflow.graph import (
    Graph,
    build_graph,
    find_references,
    match_reference,
    resolve_references,
)
from stackflow.operation import (
    ACTION_CODES,
    CODE_ACTIONS,
    FLAG_DIFF_OMITTED,
    FLAG_DRIFT,
    FLAG_UNRECORDED,
    PLAN_INLINE_LIMIT,
    DescribeInput,
    LoadBatchInput,
    LoadedBatch,
    NodeInput,
    NodeResult,
    NodeStatus,
    OperationPlan,
    PhaseInput,
    PlannedNode,
    PrepareInput,
    PreviewBatchInput,
    PreviewBatchResult,
    references_entry,
)
from stackflow.plan_store import PlanStore
from stackflow.release import Approval, Operation, Phase, Release, ReleaseStore
from stackflow.spec import Resource, Spec, parse_spec
from stackflow.spec_store import SpecStore

PREVIEW_PARALLELISM = 16


def _digest(attributes: Mapping[str, Any]) -> str:
    body = json.dumps(attributes, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _state_by_id(release: Release | None) -> dict[str, Resource]:
    return {} if release is None else {r.id: r for r in release.state.resources}


def _planned(graph: Graph, types: Mapping[str, str], reverse: bool = False) -> list[PlannedNode]:
    """Nodes in walk order; for deletes, a node waits for its dependents instead."""
    if reverse:
        order = graph.reverse_topological_order()
        return [PlannedNode(id=i, type=types[i], deps=graph.dependents(i)) for i in order]
    order = graph.topological_order()
    return [PlannedNode(id=i, type=types[i], deps=graph.dependencies(i)) for i in order]


UNKNOWN_UNTIL_APPLY = "(known after apply)"


def _mark_unknown(value: Any, known_ids: Container[str]) -> Any:
    """``value`` with every ``$kusion_path`` reference shown as known only after apply."""
    if isinstance(value, str):
        return UNKNOWN_UNTIL_APPLY if match_reference(value, known_ids) else value
    if isinstance(value, Mapping):
        return {k: _mark_unknown(v, known_ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_mark_unknown(v, known_ids) for v in value]
    return value


def _referenced_ids(resource: Resource, known_ids: Iterable[str]) -> list[str]:
    return sorted({ref.resource_id for ref in find_references(resource.attributes, known_ids)})


def deletion_plan(resources: list[Resource]) -> list[PlannedNode]:
    """Reverse dependency order over recorded state (edges to resources not listed drop)."""
    ids = {r.id for r in resources}
    deps = {r.id: [d for d in r.depends_on if d in ids] for r in resources}
    graph = Graph.from_dependencies(deps)
    return _planned(graph, {r.id: r.type for r in resources}, reverse=True)


class OperationActivities:
    """Holds the shared clients; its bound methods are the registered activities."""

    def __init__(
        self,
        registry: RuntimeRegistry,
        releases: ReleaseStore,
        specs: SpecStore,
        cache: PriorStateCache,
        plans: PlanStore | None = None,
    ) -> None:
        self.registry = registry
        self.releases = releases
        self.specs = specs
        self.plans = plans or PlanStore(specs.root.parent / "plans")
        self.cache = cache
        self.state = ReleaseStateReader(releases)

    # ---- prepare ---------------------------------------------------------------------------
    @activity.defn(name="prepare_operation")
    async def prepare_operation(self, inp: PrepareInput) -> OperationPlan:
        with temporal_errors():
            return await asyncio.to_thread(self._prepare, inp)

    def _load_spec(self, inp: PrepareInput) -> tuple[Spec | None, str | None]:
        request = inp.request
        if request.spec is not None:
            spec = parse_spec(request.spec, source="input.spec")
            return spec, self.specs.put(spec)
        if request.spec_ref is not None:
            return self.specs.get(request.spec_ref), request.spec_ref
        return None, None

    def _prepare(self, inp: PrepareInput) -> OperationPlan:
        request = inp.request
        spec, ref = self._load_spec(inp)
        if inp.operation == "preview":
            assert spec is not None
            latest = self.releases.latest(request.project, request.workspace)
            return self._plan(spec, ref, None, _state_by_id(latest))
        operation = Operation.destroy if inp.operation == "destroy" else Operation.apply
        release = self._open_release(inp, operation, spec)
        state = _state_by_id(release)
        if operation == Operation.destroy:
            return self._stored(
                self._last_spec_ref(request.project, request.workspace),
                release.revision,
                [],
                deletion_plan(list(state.values())),
            )
        assert spec is not None
        return self._plan(spec, ref, release.revision, state)

    def _last_spec_ref(self, project: str, workspace: str) -> str | None:
        """The spec of the stack's latest release that has one: a destroy's deletes run with
        its ``context`` (kubeconfig, provider credentials) though the destroy has no spec."""
        for revision in reversed(self.releases.revisions(project, workspace)):
            spec = self.releases.get(project, workspace, revision).spec
            if spec is not None:
                return self.specs.put(spec)
        return None

    def _options(
        self, project: str, workspace: str, spec_ref: str | None, *, force: bool, adopt: bool
    ) -> RuntimeOptions:
        """Per-run runtime options; the spec's ``context`` travels by ref, never in history."""
        context = self.specs.get(spec_ref).context if spec_ref else {}
        return RuntimeOptions(
            project=project, workspace=workspace, force=force, adopt=adopt, context=context
        )

    def _open_release(self, inp: PrepareInput, operation: Operation, spec: Spec | None) -> Release:
        """Create release N, or find the one this very run created before a retry."""
        request = inp.request
        latest = self.releases.latest(request.project, request.workspace)
        if (
            latest is not None
            and not latest.phase.is_final
            and latest.run_id is not None
            and latest.run_id == inp.run_id
        ):
            return latest
        return self.releases.create(
            request.project,
            request.workspace,
            operation,
            spec,
            workflow_id=inp.workflow_id,
            run_id=inp.run_id,
        )

    def _plan(
        self, spec: Spec, ref: str | None, revision: int | None, state: Mapping[str, Resource]
    ) -> OperationPlan:
        graph = build_graph(spec)
        types = {r.id: str(r.type) for r in spec.resources}
        gone = [r for r in state.values() if r.id not in types]
        nodes = _planned(graph, types)
        by_id = {r.id: r for r in spec.resources}
        for node in nodes:
            refs = find_references(by_id[node.id].attributes, types)
            node.refs = sorted({(ref.resource_id, ref.path) for ref in refs})
        return self._stored(ref, revision, nodes, deletion_plan(gone))

    def _stored(
        self,
        spec_ref: str | None,
        revision: int | None,
        nodes: list[PlannedNode],
        deletions: list[PlannedNode],
    ) -> OperationPlan:
        """Store the plan; return its ref, its size and, when small, the plan itself."""
        inline = len(nodes) + len(deletions) <= PLAN_INLINE_LIMIT
        return OperationPlan(
            spec_ref=spec_ref,
            plan_ref=self.plans.put(nodes, deletions),
            revision=revision,
            node_count=len(nodes),
            deletion_count=len(deletions),
            inline=inline,
            nodes=nodes if inline else [],
            deletions=deletions if inline else [],
        )

    # ---- plan reads --------------------------------------------------------------------------
    @activity.defn(name="load_batch")
    async def load_batch(self, inp: LoadBatchInput) -> LoadedBatch:
        with temporal_errors():
            return await asyncio.to_thread(self._load_batch, inp)

    def _load_batch(self, inp: LoadBatchInput) -> LoadedBatch:
        plan = self.plans.get(inp.plan_ref)
        every = plan.of(inp.deletions)
        picked = [(every[inp.start + i], code) for i, code in enumerate(inp.actions) if code != "."]
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
                action=CODE_ACTIONS[code],
                deps=[d for d in node.deps if d in relevant],
            )
            for node, code in picked
        ]
        return LoadedBatch(nodes=nodes, blocked=blocked)

    @activity.defn(name="describe_changes")
    async def describe_changes(self, inp: DescribeInput) -> list[dict[str, Any]]:
        with temporal_errors():
            return await asyncio.to_thread(self._describe, inp)

    def _describe(self, inp: DescribeInput) -> list[dict[str, Any]]:
        plan = self.plans.get(inp.plan_ref)
        described = []
        for kind, index, action, flags, ref_index, ref_path in inp.items:
            node = plan.of(kind == "d")[index]
            change: dict[str, Any] = {
                "id": node.id,
                "type": node.type,
                "action": action,
                "drift": bool(flags & FLAG_DRIFT),
                "diff": [],
            }
            if flags & FLAG_DIFF_OMITTED:
                change["diff_omitted"] = True
            if ref_index >= 0:
                rid = plan.nodes[ref_index].id
                change["diff"] = [references_entry(f"{rid}.{ref_path}" if ref_path else rid)]
            described.append(change)
        return described

    # ---- preview ---------------------------------------------------------------------------
    @activity.defn(name="preview_batch")
    async def preview_batch(self, inp: PreviewBatchInput) -> PreviewBatchResult:
        with temporal_errors():
            async with heartbeating(f"preview {inp.start}-{inp.end}"):
                return await self._preview_batch(inp)

    async def _preview_batch(self, inp: PreviewBatchInput) -> PreviewBatchResult:
        plan = await asyncio.to_thread(self.plans.get, inp.plan_ref)
        nodes = plan.nodes[inp.start : inp.end]
        ids = [n.id for n in nodes]
        delete_ids = [n.id for n in plan.deletions[inp.start : inp.end]]
        changes = await self._preview_changes(inp, ids, delete_ids)
        result = PreviewBatchResult()
        codes = []
        for change in changes:
            flags = FLAG_UNRECORDED if change.pop("unrecorded", False) else 0
            if change.get("drift"):
                flags |= FLAG_DRIFT
            if inp.with_diff:
                result.details.append(change)
            elif change.get("diff"):
                flags |= FLAG_DIFF_OMITTED
            codes.append(f"{ACTION_CODES[change['action']]}{flags}")
        result.codes = "".join(codes)
        for offset, node in enumerate(nodes):
            if node.refs and changes[offset]["action"] == "UnChanged":
                result.refs.extend(
                    (inp.start + offset, plan.node_index[rid], path)
                    for rid, path in node.refs
                    if rid in plan.node_index
                )
        return result

    async def _preview_changes(
        self, inp: PreviewBatchInput, ids: list[str], delete_ids: list[str]
    ) -> list[dict[str, Any]]:
        prior = await asyncio.to_thread(self.cache.prior, inp.project, inp.workspace)
        current: Mapping[str, Resource]
        if inp.revision is not None:
            current = await asyncio.to_thread(
                self.state.resources,
                inp.project,
                inp.workspace,
                inp.revision,
                [*ids, *delete_ids],
            )
        else:
            current = prior
        resources = self.specs.resources(inp.spec_ref) if inp.spec_ref else {}
        options = self._options(
            inp.project, inp.workspace, inp.spec_ref, force=inp.force, adopt=inp.adopt
        )
        gate = asyncio.Semaphore(PREVIEW_PARALLELISM)

        async def one(resource_id: str, deleting: bool) -> dict[str, Any]:
            async with gate:
                if deleting:
                    return await self._preview_delete(current[resource_id], prior, options)
                return await self._preview_apply(
                    resources[resource_id], resources, prior, current, options, inp.ignore_fields
                )

        jobs = [one(i, False) for i in ids] + [one(i, True) for i in delete_ids]
        return list(await asyncio.gather(*jobs))

    async def _preview_apply(
        self,
        resource: Resource,
        spec_resources: Mapping[str, Resource],
        prior: Mapping[str, Resource],
        current: Mapping[str, Resource],
        options: RuntimeOptions,
        ignore_fields: list[str],
    ) -> dict[str, Any]:
        runtime = self.registry.get(str(resource.type))
        recorded = current.get(resource.id)
        attributes, resolved = self._resolve_for_preview(resource, spec_resources, current)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
        )
        live = await runtime.read(request, options)
        sensitive = sensitive_paths_for(str(resource.type), resource.attributes)
        if resolved:
            result = await runtime.preview(request, options)
            would_be = result.would_be
            sensitive = result.sensitive_paths + sensitive
        else:
            # A dependency this run creates first: the referenced value is not known yet.
            would_be = _mark_unknown(resource.attributes, spec_resources)
        before = prior.get(resource.id)
        change = diff_resource(
            resource.id,
            str(resource.type),
            would_be,
            live,
            before.attributes if before else None,
            ignore_fields=ignore_fields,
            sensitive_paths=sensitive,
        )
        data = change.model_dump(mode="json")
        if recorded is None and data["action"] == "UnChanged":
            # Matches already, but this stack has not recorded it: apply adopts it into state.
            data["unrecorded"] = True
        return data

    @staticmethod
    def _resolve_for_preview(
        resource: Resource,
        spec_resources: Mapping[str, Resource],
        current: Mapping[str, Resource],
    ) -> tuple[dict[str, Any], bool]:
        """Attributes with references resolved from the recorded state of the dependencies,
        and whether that was possible (not when a dependency is not applied yet)."""
        referenced = _referenced_ids(resource, spec_resources)
        if not referenced:
            return resource.attributes, True
        if any(rid not in current for rid in referenced):
            return resource.attributes, False
        live = {rid: current[rid].attributes for rid in referenced}
        try:
            return resolve_references(resource.attributes, live), True
        except SpecError:
            return resource.attributes, False

    async def _preview_delete(
        self, resource: Resource, prior: Mapping[str, Resource], options: RuntimeOptions
    ) -> dict[str, Any]:
        runtime = self.registry.get(str(resource.type))
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=resource.attributes,
            extensions=resource.extensions,
            prior_state=resource.attributes,
        )
        live = await runtime.read(request, options)
        before = prior.get(resource.id)
        change = diff_resource(
            resource.id,
            str(resource.type),
            None,
            live if live is not None else resource.attributes,
            before.attributes if before else resource.attributes,
            sensitive_paths=sensitive_paths_for(str(resource.type), resource.attributes),
        )
        return change.model_dump(mode="json")

    # ---- phases ----------------------------------------------------------------------------
    @activity.defn(name="set_phase")
    async def set_phase(self, inp: PhaseInput) -> None:
        with temporal_errors():
            await asyncio.to_thread(self._set_phase, inp)

    def _set_phase(self, inp: PhaseInput) -> None:
        approval = Approval.model_validate(inp.approval) if inp.approval else None
        release = self.releases.set_phase(
            inp.project,
            inp.workspace,
            inp.revision,
            Phase(inp.phase),
            error=inp.error,
            changes=inp.changes,
            approval=approval,
        )
        if release.phase == Phase.succeeded:
            self.cache.remember(release)

    # ---- resources -------------------------------------------------------------------------
    @activity.defn(name="apply_resource")
    async def apply_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors():
            async with heartbeating(f"apply {inp.resource_id}"):
                return await self._apply(inp)

    async def _apply(self, inp: NodeInput) -> NodeResult:
        if inp.spec_ref is None:
            raise SpecError(f"{inp.resource_id}: apply needs the spec (spec_ref is missing)")
        spec_resources = self.specs.resources(inp.spec_ref)
        resource = spec_resources.get(inp.resource_id)
        if resource is None:
            raise SpecError(f"{inp.resource_id}: not in spec {inp.spec_ref}")
        attributes = resource.attributes
        references = find_references(attributes, spec_resources)
        wanted = [resource.id, *sorted({ref.resource_id for ref in references})]
        state = await asyncio.to_thread(
            self.state.resources, inp.project, inp.workspace, inp.revision, wanted
        )
        if references:
            live_deps = {rid: r.attributes for rid, r in state.items() if rid != resource.id}
            attributes = resolve_references(attributes, live_deps)
        recorded = state.get(resource.id)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
        )
        options = self._options(
            inp.project, inp.workspace, inp.spec_ref, force=inp.force, adopt=inp.adopt
        )
        runtime = self.registry.get(str(resource.type))
        live = await runtime.apply(request, options)
        if inp.watch:
            live = await runtime.wait_ready(request, options)
        applied = Resource(
            id=resource.id,
            type=resource.type,
            attributes=live,
            depends_on=list(resource.depends_on),
            extensions=resource.extensions,
        )
        await asyncio.to_thread(
            self.releases.record_resource, inp.project, inp.workspace, inp.revision, applied
        )
        return NodeResult(
            id=resource.id, action=inp.action, status=NodeStatus.succeeded, digest=_digest(live)
        )

    @activity.defn(name="delete_resource")
    async def delete_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors():
            async with heartbeating(f"delete {inp.resource_id}"):
                return await self._delete(inp)

    async def _delete(self, inp: NodeInput) -> NodeResult:
        recorded = await asyncio.to_thread(
            self.state.resource, inp.project, inp.workspace, inp.revision, inp.resource_id
        )
        if recorded is not None:
            request = ResourceRequest(
                id=recorded.id,
                type=str(recorded.type),
                attributes=recorded.attributes,
                extensions=recorded.extensions,
                prior_state=recorded.attributes,
            )
            options = self._options(
                inp.project, inp.workspace, inp.spec_ref, force=inp.force, adopt=inp.adopt
            )
            await self.registry.get(str(recorded.type)).delete(request, options)
            await asyncio.to_thread(
                self.releases.record_deletion,
                inp.project,
                inp.workspace,
                inp.revision,
                inp.resource_id,
            )
        # Not in state any more: an earlier attempt already deleted and recorded it.
        return NodeResult(id=inp.resource_id, action="Delete", status=NodeStatus.succeeded)

    def all(self) -> list[Any]:
        return [
            self.prepare_operation,
            self.preview_batch,
            self.load_batch,
            self.describe_changes,
            self.set_phase,
            self.apply_resource,
            self.delete_resource,
        ]
