"""The spec's `context` reaches runtimes on apply, and on destroy (which has no spec)."""

from __future__ import annotations

from typing import Any

from stackflow.activities import WorkerActivities
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.spec import parse_spec
from stackflow.model.release import Phase
from stackflow.runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.temporal.activity_io import NodeInput, PrepareInput
from stackflow.temporal.operation import OperationInput


class RecordingRuntime(Runtime):
    """Keeps what it was called with; exercises the activity plumbing, not a runtime."""

    type_name = "OnPrem"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.owners: list[RunRef | None] = []
        self.objects: dict[str, Attributes] = {}

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return self.objects.get(resource.id)

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        self.calls.append(("apply", dict(options.context)))
        self.owners.append(options.owner)
        self.objects[resource.id] = dict(resource.attributes)
        return dict(resource.attributes)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self.calls.append(("delete", dict(options.context)))
        self.owners.append(options.owner)
        self.objects.pop(resource.id, None)


async def test_context_reaches_apply_and_destroy(backend: StateBackend) -> None:
    runtime = RecordingRuntime()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    acts = WorkerActivities.create(registry, backend, PriorStateCache(None, backend))
    applier = RunRef(workflow_id="wf", run_id="r1")
    destroyer = RunRef(workflow_id="wf", run_id="r2")
    spec = {
        "resources": [{"id": "a", "type": "OnPrem", "attributes": {"kind": "File", "path": "/a"}}],
        "context": {"env": {"TOKEN": "t0"}},
    }
    parse_spec(spec)
    request = OperationInput(project="p", workspace="w", spec=spec, auto_approve=True)
    plan = await acts.prepare.prepare_operation(
        PrepareInput(operation="apply", request=request, workflow_id="wf", run_id="r1")
    )
    assert plan.revision == 1 and plan.spec_ref is not None
    assert backend.lock(StackRef("p", "w")).holder() == RunRef("wf", "r1")  # type: ignore[union-attr]
    node = NodeInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=plan.spec_ref,
        resource_id="a",
        action="Create",
        owner=applier,
    )
    await acts.walk.apply_resource(node)
    assert [r.id for r in backend.get(StackRef("p", "w"), 1).state.resources] == ["a"]
    backend.set_phase(StackRef("p", "w"), 1, Phase.succeeded, run=RunRef("wf", "r1"))

    destroy = await acts.prepare.prepare_operation(
        PrepareInput(
            operation="destroy",
            request=OperationInput(project="p", workspace="w"),
            workflow_id="wf",
            run_id="r2",
        )
    )
    assert [n.id for n in destroy.deletions] == ["a"]
    assert destroy.revision == 2 and destroy.spec_ref == plan.spec_ref  # the applied spec
    await acts.walk.delete_resource(
        node.model_copy(
            update={"revision": destroy.revision, "spec_ref": destroy.spec_ref, "owner": destroyer}
        )
    )
    assert runtime.calls == [
        ("apply", {"env": {"TOKEN": "t0"}}),
        ("delete", {"env": {"TOKEN": "t0"}}),
    ]
    assert runtime.owners == [applier, destroyer]  # each runtime call names its writer
    assert runtime.objects == {}
    assert backend.get(StackRef("p", "w"), 2).state.resources == []
