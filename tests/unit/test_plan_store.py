"""The content-addressed plan store and the workflow's compact preview/result keeping."""

from __future__ import annotations

import pytest

from stackflow.core.errors import SpecError
from stackflow.model.plan import PlannedNode
from stackflow.state.backend import StateBackend
from stackflow.state.plan_store import PlanStore
from stackflow.temporal.activity_io import PreviewBatchInput, PreviewBatchResult
from stackflow.temporal.operation import (
    DETAIL_LIMIT,
    BatchResult,
    NodeResult,
    NodeStatus,
    OperationPlan,
)
from stackflow.workflows.lines import PreviewLines
from stackflow.workflows.nodes import Tally


def test_plan_round_trip_is_content_addressed(backend: StateBackend) -> None:
    store = PlanStore(backend)
    nodes = [
        PlannedNode(id="a", type="OnPrem"),
        PlannedNode(id="b", type="OnPrem", deps=["a"], refs=[("a", "path")]),
    ]
    gone = [PlannedNode(id="z", type="OnPrem")]
    ref = store.put(nodes, gone)
    assert store.put(nodes, gone) == ref and ref.startswith("sha256:")
    plan = store.get(ref)
    assert [n.model_dump() for n in plan.nodes] == [n.model_dump() for n in nodes]
    assert plan.deletions[0].id == "z" and plan.node_index == {"a": 0, "b": 1}
    assert plan.deletion_index == {"z": 0} and plan.of(True) == plan.deletions
    # another worker (its own store, nothing cached) reads the same plan from the backend
    elsewhere = PlanStore(backend).get(ref)
    assert [n.model_dump() for n in elsewhere.nodes] == [n.model_dump() for n in nodes]
    assert PlanStore(backend).put(nodes, []) != ref  # other content, other ref
    with pytest.raises(SpecError, match="expected"):
        store.get("sha256:nothex")
    with pytest.raises(SpecError, match="not found"):
        store.get("sha256:" + "0" * 64)


def test_a_plan_put_is_held_as_loaded_and_the_one_before_goes(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process that stores a plan reads it back without the backend, as another
    worker loads it; a big plan held before it is dropped once both are over the budget."""
    import stackflow.state.plan_store as plan_store

    monkeypatch.setattr(plan_store, "CACHED_PLAN_BYTES", 600)
    store = PlanStore(backend)
    old = store.put([PlannedNode(id=f"old{i}", type="OnPrem") for i in range(20)], [])
    nodes = [
        PlannedNode(id=f"n{i}", type="OnPrem", deps=[f"n{i - 1}"] if i else []) for i in range(20)
    ]
    ref = store.put(nodes, [PlannedNode(id="z", type="OnPrem")])
    assert store._cache.held <= 600  # the earlier plan went
    monkeypatch.setattr(backend, "get_blob", lambda *a: pytest.fail("read from the backend"))
    held = store.get(ref)
    assert held.node_index["n3"] == 3 and held.deletion_index == {"z": 0}
    monkeypatch.undo()
    loaded = PlanStore(backend).get(ref)
    assert [n.model_dump() for n in held.nodes] == [n.model_dump() for n in loaded.nodes]
    assert [n.model_dump() for n in held.deletions] == [n.model_dump() for n in loaded.deletions]
    assert store.get(old).node_index["old0"] == 0  # read again from the backend


def _call(start: int, end: int, with_diff: bool) -> PreviewBatchInput:
    return PreviewBatchInput(
        project="p",
        workspace="w",
        spec_ref=None,
        revision=None,
        plan_ref="sha256:" + "0" * 64,
        start=start,
        end=end,
        with_diff=with_diff,
    )


def _change(i: int, action: str, diff: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {"id": f"n{i}", "type": "OnPrem", "action": action, "drift": False, "diff": diff or []}


def test_preview_lines_settle_references_and_record_only() -> None:
    plan = OperationPlan(spec_ref=None, plan_ref="sha256:" + "0" * 64, node_count=3)
    lines = PreviewLines(plan)
    content = [{"path": "content", "old": "a", "new": "b"}]
    lines.add(
        _call(0, 200, True),
        PreviewBatchResult(
            codes="U0N0N4",
            details=[
                _change(0, "Update", content),
                _change(1, "UnChanged"),
                _change(2, "UnChanged"),
            ],
            refs=[(1, 0, "content"), (2, 0, "mode")],
        ),
    )
    lines.settle()
    view = lines.view()
    assert [c["action"] for c in view["changes"]] == ["Update", "Update", "UnChanged"]
    assert view["changes"][1]["diff"][-1]["new"] == "(known after apply: n0.content)"
    assert view["summary"] == {"Create": 0, "Update": 2, "Delete": 0, "UnChanged": 1}
    assert "truncated" not in view
    assert lines.picks() == ([(0, "Update"), (1, "Update"), (2, "UnChanged")], [])
    assert lines.undescribed() is None


def test_preview_lines_past_the_detail_limit_describe_what_they_show() -> None:
    n = 700
    plan = OperationPlan(spec_ref=None, plan_ref="sha256:" + "0" * 64, node_count=n)
    lines = PreviewLines(plan)
    for start in range(0, n, 200):
        end = min(start + 200, n)
        with_diff = start < DETAIL_LIMIT
        codes = "".join("C2" if i == n - 1 else "N0" for i in range(start, end))
        details = [_change(i, "UnChanged") for i in range(start, end)] if with_diff else []
        refs = [(n - 2, n - 1, "")] if start <= n - 2 < end else []
        lines.add(
            _call(start, start + 200, with_diff),
            PreviewBatchResult(codes=codes, details=details, refs=refs),
        )
    lines.settle()
    describe = lines.undescribed()
    assert describe is not None
    assert describe.items == [
        ("n", n - 2, "Update", 0, n - 1, ""),
        ("n", n - 1, "Create", 2, -1, ""),
    ]
    lines.described(describe, [_change(n - 2, "Update"), _change(n - 1, "Create")])
    view = lines.view()
    assert view["truncated"] and [c["id"] for c in view["changes"]] == [f"n{n - 2}", f"n{n - 1}"]
    assert view["summary"]["UnChanged"] == n - 2
    assert lines.picks()[0] == [(n - 2, "Update"), (n - 1, "Create")]


def test_tally_keeps_counts_and_what_did_not_succeed() -> None:
    ok = NodeResult(id="a", action="Create", status=NodeStatus.succeeded)
    bad = NodeResult(id="b", action="Create", status=NodeStatus.failed, error="boom")
    full = Tally(full=True)
    full.merge(BatchResult(results=[ok, bad]))
    assert full.results == [ok, bad] and full.counts == {"succeeded": 1, "failed": 1}
    compact = Tally(full=False)
    compact.merge(
        BatchResult(results=[bad], counts={"succeeded": 900, "failed": 1}, first_failed=bad)
    )
    compact.add(ok)
    assert compact.results == [bad] and compact.first_failed == bad
    assert compact.counts == {"succeeded": 901, "failed": 1}
