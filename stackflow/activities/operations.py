"""The activities of the operation workflows: all I/O lives here.

Thin adapters: load the spec by ref, read prior state (Redis, then the state backend),
call the runtime, write state. Each one is idempotent (apply is declarative, deleting a
missing object succeeds, release writes are upserts) and returns a small summary: the full
live state goes to the state backend, never into workflow history.

Every state write is fenced by the run that holds the stack (``RunRef``): the calling run,
or for a batch child the parent named in the input. A stack held by a run that Temporal
says has closed is recovered (its release closed as failed, saying why) or, for the new run
of a reset of the same workflow, handed over.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from stackflow.activities.errors import temporal_errors, to_application_error
from stackflow.activities.heartbeat import heartbeating
from stackflow.activities.runs import RunOracle, TemporalRunOracle
from stackflow.budget import BUDGET, compact_change, fit_changes, short_error
from stackflow.cache import PriorStateCache
from stackflow.diff import (
    RECORDED_SENSITIVE_KEY,
    SecretSet,
    derived_sensitive_paths,
    diff_resource,
    equal_value_paths,
    input_paths,
    recorded_sensitive,
    sensitive_paths_for,
    sensitive_values,
    tainted_paths,
)
from stackflow.diff_store import put_changes, put_index
from stackflow.errors import (
    FencedError,
    GraphError,
    NotFoundError,
    SpecError,
    StackLockedError,
)
from stackflow.graph import (
    Graph,
    build_graph,
    find_references,
    implicit_dependencies,
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
    DiffIndexInput,
    GroupInput,
    LoadBatchInput,
    LoadedBatch,
    NodeInput,
    NodeResult,
    NodeStatus,
    OperationInput,
    OperationPlan,
    PhaseInput,
    PlannedNode,
    PrepareInput,
    PreviewBatchInput,
    PreviewBatchResult,
    RunOwner,
    check_request,
    references_entry,
)
from stackflow.plan_store import PlanStore
from stackflow.release import Approval, Operation, Phase, Release
from stackflow.runtimes import guard
from stackflow.runtimes.base import ResourceRequest, Runtime, RuntimeOptions, read_scope
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.selection import (
    LEFT_OUT_LIMIT,
    Selected,
    Selection,
    check_patterns,
    select,
)
from stackflow.spec import Resource, Spec, parse_spec
from stackflow.spec_store import SpecStore
from stackflow.state.backend import RunRef, StackLock, StateBackend

PREVIEW_PARALLELISM = 16
COALESCED_PARALLELISM = 64
STACK_SECRETS_KEPT = 256
"""Stacks whose known secrets (digests) a worker remembers, the latest revision of each."""
"""Calls in flight at once to a runtime that merges concurrent calls into one command."""


def _run_key(run: RunRef | None = None) -> str:
    """Which run's reads a read scope holds: ``run``, else the calling activity's run (outside
    an activity, e.g. in tests: a key of its own). One format for the preview that lists and
    the walk that looks its listing up."""
    if run is None:
        try:
            info = activity.info()
        except RuntimeError:
            return uuid.uuid4().hex
        run = RunRef(info.workflow_id or "", info.workflow_run_id or "")
    return f"{run.workflow_id}/{run.run_id}"


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


def _as_desired(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded attributes as a delete's desired attributes: without the list of sensitive
    paths stackflow added (runtimes validate their attributes; prior_state keeps it)."""
    return {k: v for k, v in recorded.items() if k != RECORDED_SENSITIVE_KEY}


def _taint(
    resource: Resource, spec_resources: Mapping[str, Resource], state: Mapping[str, Resource]
) -> list[str]:
    """Paths of ``resource`` that take a sensitive value of a recorded dependency."""
    deps = {
        rid: (str(state[rid].type), state[rid].attributes)
        for rid in _referenced_ids(resource, spec_resources)
        if rid in state
    }
    return tainted_paths(resource.attributes, deps) if deps else []


def _known_secrets(
    resource: Resource,
    spec_resources: Mapping[str, Resource],
    state: Mapping[str, Resource],
    context: Mapping[str, Any],
) -> set[str]:
    """The plaintext values known sensitive for this resource's run: the sensitive values
    of the recorded state of what it references (and its own), and ``context.env`` (the
    rest of the stack's: :meth:`OperationActivities._stack_secrets`)."""
    ids = {resource.id, *_referenced_ids(resource, spec_resources)}
    secrets: set[str] = set()
    for rid in ids:
        recorded = state.get(rid)
        if recorded is not None:
            paths = sensitive_paths_for(str(recorded.type), recorded.attributes)
            secrets |= sensitive_values(recorded.attributes, paths)
    env = context.get("env")
    if isinstance(env, Mapping):
        secrets |= sensitive_values(dict(env), ["*"])
    return secrets


def _sensitive_inputs(
    resource_type: str,
    desired: Mapping[str, Any],
    tainted: list[str],
    reported: list[str],
) -> list[str]:
    """Paths of the desired attributes (references resolved) that hold a sensitive value:
    taint, what the type says (a Secret's data), and what the runtime reports sensitive
    that is an input rather than a value it computed."""
    own = sensitive_paths_for(resource_type, desired)
    return sorted({*tainted, *own, *input_paths(desired, reported)})


def sensitive_record(
    resource_type: str,
    desired: Mapping[str, Any],
    live: Mapping[str, Any],
    tainted: list[str],
    secrets: Container[str],
) -> list[str]:
    """Every path of ``live`` to record as sensitive: what the runtime reported, the tainted
    inputs, what it derived from a sensitive input (:func:`derived_sensitive_paths`) and any
    value equal to a known sensitive value (:func:`equal_value_paths`)."""
    reported = recorded_sensitive(live)
    inputs = _sensitive_inputs(resource_type, desired, tainted, reported)
    return sorted(
        {
            *reported,
            *tainted,
            *derived_sensitive_paths(desired, live, inputs),
            *equal_value_paths(live, secrets),
        }
    )


async def _pre_check(runtime: Runtime, request: ResourceRequest, options: RuntimeOptions) -> None:
    """The worker policy right before a runtime call (resolved attributes), unless the
    runtime checks it inside that call anyway."""
    if not runtime.checks_every_call:
        await asyncio.to_thread(runtime.check_policy, request, options)


def _deletion_request(recorded: Resource) -> ResourceRequest:
    return ResourceRequest(
        id=recorded.id,
        type=str(recorded.type),
        attributes=_as_desired(recorded.attributes),
        extensions=recorded.extensions,
        prior_state=recorded.attributes,
    )


@dataclass
class _Applying:
    """One node ready to apply (see ``OperationActivities._applying``)."""

    resource: Resource
    request: ResourceRequest
    runtime: Runtime
    options: RuntimeOptions
    depends: list[str]
    tainted: list[str]
    secrets: Container[str]

    def applied(self, live: dict[str, Any]) -> Resource:
        """The state to record: the live attributes, with every path that may hold a secret
        marked (:func:`sensitive_record`), so it is sealed at rest and masked wherever shown."""
        marked = sensitive_record(
            self.request.type, self.request.attributes, live, self.tainted, self.secrets
        )
        if marked or RECORDED_SENSITIVE_KEY in live:
            live = {**live, RECORDED_SENSITIVE_KEY: marked}
        return Resource(
            id=self.resource.id,
            type=self.resource.type,
            attributes=live,
            depends_on=self.depends,
            extensions=self.resource.extensions,
        )


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


OPERATIONS = {
    "apply": Operation.apply,
    "destroy": Operation.destroy,
    "rollback": Operation.rollback,
    "refresh": Operation.refresh,
}


class OperationActivities:
    """Holds the shared clients; its bound methods are the registered activities."""

    def __init__(
        self,
        registry: RuntimeRegistry,
        backend: StateBackend,
        cache: PriorStateCache,
        oracle: RunOracle | None = None,
    ) -> None:
        self.registry = registry
        self.backend = backend
        self.specs = SpecStore(backend)
        self.plans = PlanStore(backend)
        self.cache = cache
        self._secrets: dict[tuple[str, str], tuple[int, SecretSet]] = {}
        self._secrets_lock = threading.Lock()
        self.oracle: RunOracle = oracle or TemporalRunOracle()

    # ---- prepare ---------------------------------------------------------------------------
    @activity.defn(name="prepare_operation")
    async def prepare_operation(self, inp: PrepareInput) -> OperationPlan:
        with temporal_errors():
            request = inp.request
            check_request(request)
            spec: Spec | None
            ref: str | None
            if inp.operation == "drift":
                return await asyncio.to_thread(self._prepare_drift, request)
            if inp.operation == "rollback":
                spec, ref = await asyncio.to_thread(self._rollback_spec, request)
            else:
                spec, ref = await asyncio.to_thread(self._load_spec, inp)
            selection = Selection(targets=request.targets, excludes=request.excludes)
            if inp.operation == "preview":
                assert spec is not None
                return await asyncio.to_thread(self._prepare_preview, inp, spec, ref, selection)
            operation = OPERATIONS.get(inp.operation, Operation.apply)
            run = RunRef(inp.workflow_id, inp.run_id)
            if operation in (Operation.destroy, Operation.refresh):
                ref = await asyncio.to_thread(
                    self.backend.latest_spec_ref, request.project, request.workspace
                )
            release = await self._open_release(
                request.project,
                request.workspace,
                operation,
                ref,
                run,
                source_revision=request.to_revision if operation == Operation.rollback else None,
            )
            return await asyncio.to_thread(
                self._prepare_walk, operation, spec, ref, release, selection
            )

    def _load_spec(self, inp: PrepareInput) -> tuple[Spec | None, str | None]:
        request = inp.request
        if request.spec is not None:
            spec = parse_spec(request.spec, source="input.spec")
            return spec, self.specs.put(spec)
        if request.spec_ref is not None:
            return self.specs.get(request.spec_ref), request.spec_ref
        return None, None

    def _rollback_spec(self, request: OperationInput) -> tuple[Spec, str]:
        """The spec of release ``to_revision``: it must exist, be an apply (or rollback) and
        still have its spec."""
        stack = f"{request.project}/{request.workspace}"
        n = request.to_revision
        if n is None:
            raise SpecError("rollback: to_revision is required (the release to restore)")
        try:
            source = self.backend.get(request.project, request.workspace, n, with_spec=False)
        except NotFoundError:
            known = self.backend.revisions(request.project, request.workspace)
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
        stack = f"{request.project}/{request.workspace}"
        latest = self.backend.latest(request.project, request.workspace, with_spec=False)
        if latest is None:
            raise NotFoundError(f"drift: stack {stack} has no releases; apply it first")
        ref = self.backend.latest_spec_ref(request.project, request.workspace)
        state = _state_by_id(latest)
        if ref is None or latest.operation == Operation.destroy:
            spec = Spec(resources=[])
        else:
            spec = self.specs.get(ref)
        return self._plan(spec, ref, latest.revision, {}, Selection(), only=set(state))

    def _prepare_preview(
        self, inp: PrepareInput, spec: Spec, ref: str | None, selection: Selection
    ) -> OperationPlan:
        request = inp.request
        latest = self.backend.latest(request.project, request.workspace, with_spec=False)
        return self._plan(spec, ref, None, _state_by_id(latest), selection)

    def _prepare_walk(
        self,
        operation: Operation,
        spec: Spec | None,
        ref: str | None,
        release: Release,
        selection: Selection,
    ) -> OperationPlan:
        state = _state_by_id(release)
        if operation in (Operation.destroy, Operation.refresh):
            graph, types = deletion_graph(list(state.values()))
            check_patterns(selection, graph.ids)
            chosen = select(graph, selection, deleting=operation == Operation.destroy)
            nodes = [n for n in _planned(graph, types, reverse=True) if n.id in chosen.kept]
            if operation == Operation.refresh:
                return self._stored(ref, release.revision, nodes, [], chosen)
            return self._stored(ref, release.revision, [], nodes, chosen)
        assert spec is not None
        return self._plan(spec, ref, release.revision, state, selection)

    async def _open_release(
        self,
        project: str,
        workspace: str,
        operation: Operation,
        spec_ref: str | None,
        run: RunRef,
        source_revision: int | None = None,
    ) -> Release:
        """Create the next release for ``run``, or find the one this very run created before
        a retry. A stack held by a run that has closed is recovered first."""
        for _ in range(5):
            lock = await asyncio.to_thread(self.backend.lock, project, workspace)
            if lock is not None and lock.held_by(run):
                return await asyncio.to_thread(
                    self.backend.get, project, workspace, lock.revision, with_spec=False
                )
            if lock is not None:
                await self._recover_or_refuse(lock)
            try:
                return await asyncio.to_thread(
                    lambda: self.backend.create(
                        project,
                        workspace,
                        operation,
                        spec_ref=spec_ref,
                        run=run,
                        source_revision=source_revision,
                    )
                )
            except StackLockedError:
                continue  # taken meanwhile: look at the new holder
        raise StackLockedError(f"stack {project}/{workspace}: too much contention for its lock")

    async def _recover_or_refuse(self, lock: StackLock) -> None:
        ended = await self.oracle.ended(lock)
        if ended is None:
            holder = lock.holder()
            link = self.oracle.link(holder) if holder else None
            raise StackLockedError(
                f"stack {lock.project}/{lock.workspace} is locked by {lock.describe()}, which "
                f"is still running"
                + (f" ({link})" if link else "")
                + "; wait for it, or approve/cancel it in the Temporal UI"
                if holder
                else f"stack {lock.project}/{lock.workspace} is locked by {lock.describe()}; "
                f"if no operation is running, unlock it: stackflow release unlock "
                f"--project {lock.project} --workspace {lock.workspace}"
            )
        recovered = await asyncio.to_thread(
            self.backend.recover, lock, f"{ended}; recovered by the next operation"
        )
        if recovered:
            activity.logger.warning(
                "recovered stack %s/%s: %s", lock.project, lock.workspace, ended
            )

    def _owner(self, owner: RunOwner | None) -> RunRef:
        """The run whose writes these are: the one named (a batch child's parent) or the
        calling run."""
        if owner is not None:
            return RunRef(owner.workflow_id, owner.run_id)
        info = activity.info()
        return RunRef(info.workflow_id or "", info.workflow_run_id or "")

    async def _fenced(self, run: RunRef, project: str, workspace: str, write: Any) -> Any:
        """Run the fenced ``write``; if the stack is held by an earlier run of the same
        workflow that has closed (a reset replaced it), take the stack over and write."""
        try:
            return await asyncio.to_thread(write)
        except FencedError:
            lock = await asyncio.to_thread(self.backend.lock, project, workspace)
            if (
                lock is None
                or lock.workflow_id != run.workflow_id
                or lock.run_id == run.run_id
                or await self.oracle.ended(lock) is None
                or not await asyncio.to_thread(self.backend.transfer, lock, run)
            ):
                raise
            activity.logger.warning("%s took over %s from a closed run", run, lock.describe())
            return await asyncio.to_thread(write)

    def _options(
        self,
        project: str,
        workspace: str,
        spec_ref: str | None,
        *,
        force: bool,
        adopt: bool,
        revision: int | None = None,
        run: RunRef | None = None,
    ) -> RuntimeOptions:
        """Per-run runtime options; the spec's ``context`` travels by ref, never in history."""
        context = self.specs.get(spec_ref).context if spec_ref else {}
        return RuntimeOptions(
            project=project,
            workspace=workspace,
            force=force,
            adopt=adopt,
            context=context,
            revision=revision,
            owner=RunOwner(workflow_id=run.workflow_id, run_id=run.run_id) if run else None,
        )

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
            for n in _planned(graph, types)
            if n.id in chosen.kept and (only is None or n.id in only)
        ]
        by_id = {r.id: r for r in spec.resources}
        for node in nodes:
            refs = find_references(by_id[node.id].attributes, types)
            node.refs = sorted({(ref.resource_id, ref.path) for ref in refs})
        deletions = [n for n in _planned(gone_graph, gone_types, reverse=True) if n.id in gone.kept]
        left = Selected(
            kept=chosen.kept | gone.kept,
            left_out=[*chosen.left_out, *gone.left_out][:LEFT_OUT_LIMIT],
            left_out_count=chosen.left_out_count + gone.left_out_count,
        )
        return self._stored(ref, revision, nodes, deletions, left)

    def _stored(
        self,
        spec_ref: str | None,
        revision: int | None,
        nodes: list[PlannedNode],
        deletions: list[PlannedNode],
        selected: Selected | None = None,
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
            left_out=selected.left_out if selected else [],
            left_out_count=selected.left_out_count if selected else 0,
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
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"preview {inp.start}-{inp.end}"):
                return await self._preview_batch(inp)

    async def _preview_batch(self, inp: PreviewBatchInput) -> PreviewBatchResult:
        plan = await asyncio.to_thread(self.plans.get, inp.plan_ref)
        nodes = plan.nodes[inp.start : inp.end]
        ids = [n.id for n in nodes]
        delete_ids = [n.id for n in plan.deletions[inp.start : inp.end]]
        changes = await self._preview_changes(inp, ids, delete_ids)
        result = await self._batch_result(inp, changes)
        for offset, node in enumerate(nodes):
            if node.refs and changes[offset]["action"] == "UnChanged":
                result.refs.extend(
                    (inp.start + offset, plan.node_index[rid], path)
                    for rid, path in node.refs
                    if rid in plan.node_index
                )
        return result

    async def _batch_result(
        self, inp: PreviewBatchInput, changes: list[dict[str, Any]]
    ) -> PreviewBatchResult:
        """Changes as a preview batch returns them: codes, the first details within the
        byte budget, the whole diff in the backend by ref."""
        result = PreviewBatchResult()
        codes = []
        for change in changes:
            flags = FLAG_UNRECORDED if change.pop("unrecorded", False) else 0
            if change.get("drift"):
                flags |= FLAG_DRIFT
            if inp.with_diff:
                result.details.append(compact_change(change))
            elif change.get("diff"):
                flags |= FLAG_DIFF_OMITTED
            codes.append(f"{ACTION_CODES[change['action']]}{flags}")
        result.codes = "".join(codes)
        if any(change.get("diff") for change in changes):
            # The whole diff (every field, whole values; sensitive ones already masked)
            # goes to the backend; history gets the shortened one, within the byte budget.
            result.diff_ref = await asyncio.to_thread(put_changes, self.backend, changes)
        result.details = fit_changes(result.details, BUDGET // 2)
        return result

    async def _preview_changes(
        self, inp: PreviewBatchInput, ids: list[str], delete_ids: list[str]
    ) -> list[dict[str, Any]]:
        prior = await asyncio.to_thread(self.cache.prior, inp.project, inp.workspace)
        current: Mapping[str, Resource]
        if inp.revision is not None:
            current = await asyncio.to_thread(
                self.backend.resources,
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
        # The worker policy, before any runtime call: the whole spec, then this batch.
        deleting = [
            current[i].model_copy(update={"attributes": _as_desired(current[i].attributes)})
            for i in delete_ids
        ]
        batch = [*(resources[i] for i in ids), *deleting]
        await asyncio.to_thread(
            guard.check_preview, self.registry, inp.spec_ref, resources, batch, options
        )
        stack_secrets = (
            await asyncio.to_thread(self._stack_secrets, inp.project, inp.workspace)
            if ids
            else SecretSet()
        )
        gate = asyncio.Semaphore(PREVIEW_PARALLELISM)
        merged = asyncio.Semaphore(COALESCED_PARALLELISM)

        def gate_for(resource_id: str, deleting: bool) -> asyncio.Semaphore:
            found = current[resource_id] if deleting else resources[resource_id]
            runtime = self.registry.find(str(found.type))
            return merged if runtime is not None and runtime.coalesces_calls else gate

        async def one(resource_id: str, deleting: bool) -> dict[str, Any]:
            async with gate_for(resource_id, deleting):
                if deleting:
                    return await self._preview_delete(current[resource_id], prior, options)
                return await self._preview_apply(
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
        with read_scope(_run_key(), (r.attributes for r in batch)):
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
        stack_secrets: SecretSet,
    ) -> dict[str, Any]:
        runtime = self.registry.get(str(resource.type))
        recorded = current.get(resource.id)
        attributes, resolved = self._resolve_for_preview(resource, spec_resources, current)
        tainted = _taint(resource, spec_resources, current)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
            sensitive_paths=tainted if resolved else [],
        )
        live, result = await runtime.observe(request, options, with_preview=resolved)
        sensitive = sensitive_paths_for(str(resource.type), resource.attributes)
        sensitive += tainted
        if recorded is not None:
            sensitive += recorded_sensitive(recorded.attributes)
        reported = result.sensitive_paths if result is not None else []
        if result is not None:
            would_be = result.would_be
            sensitive = result.sensitive_paths + sensitive
        else:
            # A dependency this run creates first: the referenced value is not known yet.
            would_be = _mark_unknown(resource.attributes, spec_resources)
        # what the runtime would compute from a sensitive input, and known secrets wherever
        # they turn up, are masked as the apply will record them
        inputs = _sensitive_inputs(str(resource.type), attributes, tainted, reported)
        secrets = (
            SecretSet(_known_secrets(resource, spec_resources, current, options.context))
            | stack_secrets
        )
        for side, computed_only in ((would_be, False), (live, True)):
            sensitive += derived_sensitive_paths(
                attributes,
                side,
                inputs,
                placeholders=(UNKNOWN_UNTIL_APPLY,),
                computed_only=computed_only,
            )
            sensitive += equal_value_paths(side, secrets)
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
            attributes=_as_desired(resource.attributes),
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
            run = self._owner(None)
            approval = Approval.model_validate(inp.approval) if inp.approval else None

            def write() -> Release:
                return self.backend.set_phase(
                    inp.project,
                    inp.workspace,
                    inp.revision,
                    Phase(inp.phase),
                    run=run,
                    error=inp.error,
                    changes=inp.changes,
                    approval=approval,
                )

            release = await self._fenced(run, inp.project, inp.workspace, write)
            if release.phase == Phase.succeeded:
                await asyncio.to_thread(self._remember, inp.project, inp.workspace, inp.revision)

    def _stack_secrets(self, project: str, workspace: str) -> SecretSet:
        """The sensitive values of the stack's latest succeeded release (as digests),
        remembered per revision: the equal-value rule looks for them in every resource."""
        revision = self.backend.latest_succeeded_revision(project, workspace)
        if revision is None:
            return SecretSet()
        key = (project, workspace)
        with self._secrets_lock:
            known = self._secrets.get(key)
        if known is not None and known[0] == revision:
            return known[1]
        values: set[str] = set()
        for resource in self.cache.prior(project, workspace).values():
            paths = sensitive_paths_for(str(resource.type), resource.attributes)
            values |= sensitive_values(resource.attributes, paths)
        secrets = SecretSet(values)
        with self._secrets_lock:
            if len(self._secrets) >= STACK_SECRETS_KEPT and key not in self._secrets:
                self._secrets.pop(next(iter(self._secrets)))
            self._secrets[key] = (revision, secrets)
        return secrets

    def _remember(self, project: str, workspace: str, revision: int) -> None:
        self.cache.remember(self.backend.get(project, workspace, revision, with_spec=False))

    # ---- resources -------------------------------------------------------------------------
    @activity.defn(name="apply_resource")
    async def apply_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"apply {inp.resource_id}"):
                return await self._apply(inp)

    def _wanted(self, inp: NodeInput, spec_resources: Mapping[str, Resource]) -> list[str]:
        """The node's id and the ids its ``$kusion_path`` references name (their recorded
        state resolves them)."""
        if inp.spec_ref is None:
            raise SpecError(f"{inp.resource_id}: apply needs the spec (spec_ref is missing)")
        resource = spec_resources.get(inp.resource_id)
        if resource is None:
            raise SpecError(f"{inp.resource_id}: not in spec {inp.spec_ref}")
        references = find_references(resource.attributes, spec_resources)
        return [resource.id, *sorted({ref.resource_id for ref in references})]

    def _applying(
        self,
        inp: NodeInput,
        spec_resources: Mapping[str, Resource],
        state: Mapping[str, Resource],
        options: RuntimeOptions,
        stack_secrets: SecretSet,
    ) -> _Applying:
        """What applying one node takes: the request with references resolved from the
        recorded state of the dependencies, its runtime, and how to record the result."""
        resource = spec_resources[inp.resource_id]
        attributes = resource.attributes
        references = find_references(attributes, spec_resources)
        if references:
            live_deps = {rid: r.attributes for rid, r in state.items() if rid != resource.id}
            attributes = resolve_references(attributes, live_deps)
        recorded = state.get(resource.id)
        tainted = _taint(resource, spec_resources, state)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
            sensitive_paths=tainted,
        )
        return _Applying(
            resource=resource,
            request=request,
            runtime=self.registry.get(str(resource.type)),
            options=options,
            # dependsOn plus the $kusion_path edges: destroy and deletions walk them in reverse
            depends=sorted({*resource.depends_on, *(ref.resource_id for ref in references)}),
            tainted=tainted,
            secrets=SecretSet(_known_secrets(resource, spec_resources, state, options.context))
            | stack_secrets,
        )

    def _node_options(self, inp: NodeInput | GroupInput, run: RunRef) -> RuntimeOptions:
        return self._options(
            inp.project,
            inp.workspace,
            inp.spec_ref,
            force=inp.force,
            adopt=inp.adopt,
            revision=inp.revision,
            run=run,
        )

    async def _holds(self, run: RunRef, project: str, workspace: str, revision: int) -> None:
        await self._fenced(
            run,
            project,
            workspace,
            lambda: self.backend.assert_holds(project, workspace, revision, run),
        )

    async def _apply(self, inp: NodeInput) -> NodeResult:
        spec_resources = self.specs.resources(inp.spec_ref) if inp.spec_ref else {}
        wanted = self._wanted(inp, spec_resources)
        state = await asyncio.to_thread(
            self.backend.resources, inp.project, inp.workspace, inp.revision, wanted
        )
        run = self._owner(inp.owner)
        secrets = await asyncio.to_thread(self._stack_secrets, inp.project, inp.workspace)
        job = self._applying(inp, spec_resources, state, self._node_options(inp, run), secrets)
        await _pre_check(job.runtime, job.request, job.options)  # resolved
        await self._holds(run, inp.project, inp.workspace, inp.revision)
        live = await job.runtime.apply(job.request, job.options)

        async def record(attributes: dict[str, Any]) -> None:
            applied = job.applied(attributes)
            await self._fenced(
                run,
                inp.project,
                inp.workspace,
                lambda: self.backend.record_resource(
                    inp.project, inp.workspace, inp.revision, applied, run=run
                ),
            )

        # Recorded before any readiness wait: an object that never gets ready is still the
        # stack's (a later destroy removes it).
        await record(live)
        if inp.watch:
            live = await job.runtime.wait_ready(job.request, job.options)
            await record(live)
        return NodeResult(
            id=job.resource.id, action=inp.action, status=NodeStatus.succeeded, digest=_digest(live)
        )

    @activity.defn(name="delete_resource")
    async def delete_resource(self, inp: NodeInput) -> NodeResult:
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"delete {inp.resource_id}"):
                return await self._delete(inp)

    async def _delete(self, inp: NodeInput) -> NodeResult:
        recorded = await asyncio.to_thread(
            self.backend.resource_state, inp.project, inp.workspace, inp.revision, inp.resource_id
        )
        run = self._owner(inp.owner)
        if recorded is not None:
            request = _deletion_request(recorded)
            options = self._node_options(inp, run)
            runtime = self.registry.get(str(recorded.type))
            await _pre_check(runtime, request, options)
            await self._holds(run, inp.project, inp.workspace, inp.revision)
            await runtime.delete(request, options)
            await self._fenced(
                run,
                inp.project,
                inp.workspace,
                lambda: self.backend.record_deletion(
                    inp.project, inp.workspace, inp.revision, inp.resource_id, run=run
                ),
            )
        # Not in state any more: an earlier attempt already deleted and recorded it.
        return NodeResult(id=inp.resource_id, action="Delete", status=NodeStatus.succeeded)

    @activity.defn(name="index_diffs")
    async def index_diffs(self, inp: DiffIndexInput) -> str:
        """One ref standing for a run's diff refs (the workflow holds a few, whatever the
        size of the stack)."""
        with temporal_errors():
            return await asyncio.to_thread(put_index, self.backend, inp.refs)

    # ---- groups of cheap nodes ---------------------------------------------------------------
    @activity.defn(name="run_group")
    async def run_group(self, inp: GroupInput) -> list[NodeResult]:
        """Apply or delete several ready nodes at once, each on its own (idempotent, as one
        node's activity). A node that fails for good (invalid input, conflict, fenced,
        unreachable past the timeout) gets a failed result; a failure worth retrying
        (unavailable, a first bug) makes the whole group retry, and the nodes that already
        succeeded simply apply again."""
        with temporal_errors(inp.unavailable_timeout_seconds):
            async with heartbeating(f"{len(inp.nodes)} resources"):
                return await self._run_group(inp)

    async def _run_group(self, inp: GroupInput) -> list[NodeResult]:
        """One state read, one lock check and one write per group; each node's runtime call
        on its own (side by side), each node's failure its own."""
        run = self._owner(inp.owner)
        project, workspace, revision = inp.project, inp.workspace, inp.revision
        options = self._node_options(inp, run)
        spec_resources = self.specs.resources(inp.spec_ref) if inp.spec_ref else {}
        nodes = {
            rid: NodeInput(
                project=project,
                workspace=workspace,
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
                    [rid] if node.action == "Delete" else self._wanted(node, spec_resources)
                )
            except Exception as exc:
                outcome[rid] = exc
        every = sorted({i for ids in wanted.values() for i in ids})
        state = await asyncio.to_thread(self.backend.resources, project, workspace, revision, every)
        secrets = (
            await asyncio.to_thread(self._stack_secrets, project, workspace)
            if any(action != "Delete" for _, action in inp.nodes)
            else SecretSet()
        )
        await self._holds(run, project, workspace, revision)
        applied: dict[str, Resource] = {}
        deleted: list[str] = []
        gate = asyncio.Semaphore(inp.concurrency)
        merged = asyncio.Semaphore(COALESCED_PARALLELISM)

        def gate_for(rid: str) -> asyncio.Semaphore:
            found = state.get(rid) if nodes[rid].action == "Delete" else spec_resources.get(rid)
            runtime = self.registry.find(str(found.type)) if found is not None else None
            return merged if runtime is not None and runtime.coalesces_calls else gate

        async def one(rid: str) -> None:
            async with gate_for(rid):
                await step(rid)

        async def step(rid: str) -> None:
            node = nodes[rid]
            try:
                if node.action == "Delete":
                    recorded = state.get(rid)
                    if recorded is not None:
                        request = _deletion_request(recorded)
                        runtime = self.registry.get(str(recorded.type))
                        await _pre_check(runtime, request, options)
                        await runtime.delete(request, options)
                        deleted.append(rid)
                    outcome[rid] = NodeResult(id=rid, action="Delete", status=NodeStatus.succeeded)
                    return
                mine = {i: state[i] for i in wanted[rid] if i in state}
                job = self._applying(node, spec_resources, mine, options, secrets)
                await _pre_check(job.runtime, job.request, options)
                live = await job.runtime.apply(job.request, options)
                applied[rid] = job.applied(live)
                outcome[rid] = NodeResult(
                    id=rid, action=node.action, status=NodeStatus.succeeded, digest=_digest(live)
                )
            except Exception as exc:  # classified below, per node
                outcome[rid] = exc

        # a walk of the run whose preview may have listed these objects on this worker
        with read_scope(_run_key(run), lists=False):
            await asyncio.gather(*(one(rid) for rid in wanted))
        order = [rid for rid, _ in inp.nodes]
        await self._fenced(
            run,
            project,
            workspace,
            lambda: self.backend.record_resources(
                project, workspace, revision, [applied[i] for i in order if i in applied], run=run
            ),
        )
        await self._fenced(
            run,
            project,
            workspace,
            lambda: self.backend.record_deletions(project, workspace, revision, deleted, run=run),
        )
        results: list[NodeResult] = []
        again: BaseException | None = None
        for rid, action in inp.nodes:
            done = outcome[rid]
            if isinstance(done, NodeResult):
                results.append(done)
                continue
            error = to_application_error(done, inp.unavailable_timeout_seconds)
            if isinstance(error, ApplicationError) and error.non_retryable:
                results.append(
                    NodeResult(
                        id=rid,
                        action=action,
                        status=NodeStatus.failed,
                        error=short_error(error.message) or error.type,
                        error_type=error.type,
                    )
                )
            elif again is None:
                again = error
        if again is not None:
            raise again  # what succeeded is recorded; the retry applies it again, harmlessly
        return results

    def all(self) -> list[Any]:
        from stackflow.activities.observe import ObserveActivities

        return [
            *ObserveActivities(self).all(),
            self.prepare_operation,
            self.preview_batch,
            self.load_batch,
            self.describe_changes,
            self.set_phase,
            self.apply_resource,
            self.delete_resource,
            self.run_group,
            self.index_diffs,
        ]
