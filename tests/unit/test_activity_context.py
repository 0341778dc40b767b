"""The spec's `context` reaches runtimes on apply, and on destroy (which has no spec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackflow.store.memory import MemoryRecordStore

from activities.operations import OperationActivities
from runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from runtimes.registry import RuntimeRegistry
from stackflow.cache import PriorStateCache
from stackflow.operation import NodeInput, OperationInput, PrepareInput
from stackflow.release import Phase, ReleaseStore
from stackflow.spec import parse_spec
from stackflow.spec_store import SpecStore


class RecordingRuntime(Runtime):
    """Keeps what it was called with; exercises the activity plumbing, not a runtime."""

    type_name = "OnPrem"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.objects: dict[str, Attributes] = {}

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return self.objects.get(resource.id)

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        self.calls.append(("apply", dict(options.context)))
        self.objects[resource.id] = dict(resource.attributes)
        return dict(resource.attributes)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self.calls.append(("delete", dict(options.context)))
        self.objects.pop(resource.id, None)


async def test_context_reaches_apply_and_destroy(tmp_path: Path) -> None:
    runtime = RecordingRuntime()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    releases = ReleaseStore(MemoryRecordStore())
    acts = OperationActivities(
        registry, releases, SpecStore(tmp_path / "specs"), PriorStateCache(None, releases)
    )
    spec = {
        "resources": [{"id": "a", "type": "OnPrem", "attributes": {"kind": "File", "path": "/a"}}],
        "context": {"env": {"TOKEN": "t0"}},
    }
    parse_spec(spec)
    request = OperationInput(project="p", workspace="w", spec=spec, auto_approve=True)
    plan = await acts.prepare_operation(
        PrepareInput(operation="apply", request=request, workflow_id="wf", run_id="r1")
    )
    assert plan.revision == 1 and plan.spec_ref is not None
    node = NodeInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=plan.spec_ref,
        resource_id="a",
        action="Create",
    )
    await acts.apply_resource(node)
    releases.set_phase("p", "w", 1, Phase.succeeded)

    destroy = await acts.prepare_operation(
        PrepareInput(
            operation="destroy",
            request=OperationInput(project="p", workspace="w"),
            workflow_id="wf",
            run_id="r2",
        )
    )
    assert [n.id for n in destroy.deletions] == ["a"]
    await acts.delete_resource(
        node.model_copy(update={"revision": destroy.revision, "spec_ref": destroy.spec_ref})
    )
    assert runtime.calls == [
        ("apply", {"env": {"TOKEN": "t0"}}),
        ("delete", {"env": {"TOKEN": "t0"}}),
    ]
    assert runtime.objects == {}
