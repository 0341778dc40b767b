"""The test-only Memory runtime (tests/fixtures/memory_runtime, registered through the
entry-point group) passes the runtime conformance suite, and the engine takes a spec of its
type: validation (type, id rule), the DAG, the policy gate, masking of its secret field, a
preview's diff. No engine, workflow or activity file knows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackflow.core.errors import SpecError
from stackflow.engine.diff import Action
from stackflow.engine.graph import build_graph
from stackflow.engine.masking import SENSITIVE_MARKER, sensitive_paths_for
from stackflow.engine.spec import parse_spec
from stackflow.model.runtime_rules import known_types, rules_for
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.guard import check_preview
from stackflow.runtimes.policy import PolicyViolation
from stackflow.runtimes.registry import default_registry
from tests.conformance.runtime_suite import RuntimeCase, RuntimeSuite, preview

pytestmark = pytest.mark.usefixtures("memory_runtime")


def memory(name: str, **attributes: object) -> ResourceRequest:
    return ResourceRequest(id=f"mem:{name}", type="Memory", attributes=attributes)


class TestMemoryRuntime(RuntimeSuite):
    @pytest.fixture
    def case(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RuntimeCase:
        monkeypatch.setenv("STACKFLOW_ONPREM_ROOTS", str(tmp_path))
        return RuntimeCase(
            type_name="Memory",
            options=RuntimeOptions(project="conformance", workspace=tmp_path.name),
            make=lambda name: memory(name, value="one", path=str(tmp_path / name)),
            change=lambda r: r.model_copy(update={"attributes": {**r.attributes, "value": "two"}}),
            invalid=lambda name: memory(name, value=42),
            refused=lambda name: memory(name, value="one", path="/etc/passwd"),
            observed=lambda live: live.get("value"),
        )


def spec(*resources: dict[str, object]) -> dict[str, object]:
    return {"resources": list(resources)}


def test_the_engine_takes_a_spec_of_the_new_type(tmp_path: Path) -> None:
    assert "Memory" in known_types()
    parsed = parse_spec(
        spec(
            {"id": "mem:db", "type": "Memory", "attributes": {"value": "a", "password": "s3"}},
            {
                "id": "mem:app",
                "type": "Memory",
                "attributes": {"value": "$kusion_path.mem:db.value"},
                "dependsOn": ["mem:db"],
            },
        )
    )
    assert build_graph(parsed).topological_order() == ["mem:db", "mem:app"]
    with pytest.raises(SpecError, match=r"id: a Memory id is mem:<name>"):
        parse_spec(spec({"id": "db", "type": "Memory", "attributes": {"value": "a"}}))
    with pytest.raises(SpecError, match=r"unknown type 'Memoryy', expected .*Memory"):
        parse_spec(spec({"id": "mem:db", "type": "Memoryy"}))

    registry = default_registry()
    options = RuntimeOptions(project="p", workspace="w")
    resources = {r.id: r for r in parsed.resources}
    check_preview(registry, None, resources, parsed.resources, options)
    refused = parse_spec(
        spec({"id": "mem:x", "type": "Memory", "attributes": {"value": "a", "path": "/etc/x"}})
    )
    with pytest.raises(PolicyViolation, match=r"attributes\.path"):
        check_preview(registry, None, {"mem:x": refused.resources[0]}, refused.resources, options)


async def test_its_secret_field_is_masked_in_a_preview() -> None:
    rules = rules_for("Memory")
    assert rules is not None and not rules.grouped
    assert sensitive_paths_for("Memory", {"value": "a", "password": "s3"}) == ["password"]
    registry = default_registry()
    case = RuntimeCase(
        type_name="Memory",
        options=RuntimeOptions(project="p", workspace="masking"),
        make=lambda name: memory(name, value="a"),
        change=lambda r: r,
        invalid=lambda name: memory(name),
        refused=lambda name: memory(name),
        observed=lambda live: live,
        runtime=registry.get("Memory"),
    )
    change = await preview(case, memory("secret", value="a", password="hunter2"))
    assert change.action is Action.Create
    shown = {f.path: f.new for f in change.diff}
    assert shown["password"] == SENSITIVE_MARKER and "hunter2" not in change.model_dump_json()
    await registry.close()
