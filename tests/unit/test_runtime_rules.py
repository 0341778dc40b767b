"""Runtimes bring their own rules, found through the ``stackflow.runtimes`` entry points;
the core asks them (spec types and ids, secrets, grouping) and imports no runtime."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stackflow.activities.prepare import plan_grouping
from stackflow.activities.resource_step import COALESCED_PARALLELISM
from stackflow.engine.masking import sensitive_paths_for
from stackflow.model.runtime_rules import (
    ENTRY_POINT_GROUP,
    RuntimeLoadError,
    all_rules,
    reload_runtimes,
    rules_for,
)
from stackflow.model.spec import ResourceType
from stackflow.runtimes.base import ReadScope
from stackflow.runtimes.kubernetes.connection import scope_key
from stackflow.runtimes.registry import default_registry
from stackflow.temporal.operation import GROUP_LIMIT, GroupSizing
from stackflow.workflows.nodes import (
    LEGACY_GROUPED,
    LEGACY_ONPREM,
    LEGACY_ONPREM_LIMIT,
    LEGACY_ONPREM_ROUNDS,
    LEGACY_TERRAFORM,
    LEGACY_TERRAFORM_LIMIT,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_built_in_runtimes_are_entry_points() -> None:
    assert {"Kubernetes", "OnPrem", "Terraform"} <= set(all_rules())
    assert {t.value for t in ResourceType} <= set(all_rules())
    registry = default_registry()
    assert {"Kubernetes", "OnPrem", "Terraform"} <= set(registry.types())
    for type_name in ("Kubernetes", "OnPrem", "Terraform"):
        assert type(registry.get(type_name)).type_name == type_name


def test_the_plan_groups_what_the_runtimes_declare_as_old_runs_did() -> None:
    """The prepare activity puts each grouped runtime's sizing on the plan; for the built-ins
    it is what the workflows' legacy constants gave runs whose plan carries none."""
    grouping = plan_grouping(["Kubernetes", "OnPrem", "Terraform", "Kubernetes", "Nope"])
    assert grouping == {
        "Kubernetes": GroupSizing(),
        "OnPrem": GroupSizing(limit=LEGACY_ONPREM_LIMIT, rounds=LEGACY_ONPREM_ROUNDS),
        "Terraform": GroupSizing(limit=LEGACY_TERRAFORM_LIMIT),
    }
    declared = {name for name, rules in all_rules().items() if rules.grouped}
    assert declared >= {*LEGACY_GROUPED, LEGACY_TERRAFORM}
    assert plan_grouping(["OnPrem"]) == {LEGACY_ONPREM: grouping["OnPrem"]}


def test_a_whole_group_fits_one_command_or_batch_of_its_runtime() -> None:
    """A Terraform group of the walk is one command and an OnPrem group one batch: its calls
    are all in flight at once and one batch of the runtime takes them all; other groups keep
    GROUP_ROUNDS rounds of their share, and a runtime not in the sizing keeps them too."""
    from stackflow.runtimes.onprem.batch import BATCH_LIMIT as ONPREM_BATCH_LIMIT
    from stackflow.runtimes.onprem.runtime import OnPremRuntime
    from stackflow.runtimes.terraform.batch import BATCH_LIMIT
    from stackflow.workflows.nodes import Sizing, group_sizes
    from stackflow.workflows.walker import GROUP_ROUNDS

    terraform, onprem = rules_for("Terraform"), rules_for("OnPrem")
    assert terraform is not None and onprem is not None
    tf_limit, onprem_limit = terraform.grouping.limit, onprem.grouping.limit
    assert tf_limit is not None and onprem_limit is not None
    onprem_rounds = onprem.grouping.rounds
    assert tf_limit <= COALESCED_PARALLELISM
    assert BATCH_LIMIT >= tf_limit > GROUP_LIMIT
    assert COALESCED_PARALLELISM >= onprem_limit == ONPREM_BATCH_LIMIT > GROUP_LIMIT
    assert OnPremRuntime.coalesces_calls and OnPremRuntime.type_name == "OnPrem"
    size = group_sizes({"Terraform": Sizing(tf_limit)})
    assert size("Terraform/apply", 1) == tf_limit
    assert size("Terraform/delete", 4) == tf_limit
    assert size("OnPrem/apply", 1) == GROUP_ROUNDS
    assert size("Kubernetes/apply", 16) == GROUP_LIMIT
    both = group_sizes(
        {"Terraform": Sizing(tf_limit), "OnPrem": Sizing(onprem_limit, onprem_rounds)}
    )
    # OnPrem: 32 a call of its share (a run asked for one call at a time still moves in
    # steps), one batch of its runtime at most (the default concurrency's share of 5)
    assert both("OnPrem/apply", 1) == onprem_rounds == 32
    assert both("OnPrem/delete", 5) == onprem_limit
    assert both("Kubernetes/delete", 1) == GROUP_ROUNDS


def test_each_runtime_owns_its_id_rule_and_secrets() -> None:
    kube, tf, onprem = rules_for("Kubernetes"), rules_for("Terraform"), rules_for("OnPrem")
    assert kube is not None and tf is not None and onprem is not None
    assert kube.id_problem("v1:ConfigMap:ns:name") is None
    assert kube.id_problem("v1:Namespace:name") is None
    assert "Kubernetes id" in (kube.id_problem("name") or "")
    assert tf.id_problem("hashicorp:random:random_password:db") is None
    assert "Terraform id" in (tf.id_problem("random_password.db") or "")
    assert onprem.id_problem("anything at all") is None
    secret = {"kind": "Secret", "data": {"a": "b"}}
    assert sensitive_paths_for("Kubernetes", secret) == ["data", "stringData"]
    assert sensitive_paths_for("OnPrem", secret) == []
    assert sensitive_paths_for("Nope", {"_stackflow_x": 1}) == ["_stackflow_x"]


def test_read_scope_counts_by_the_runtimes_key() -> None:
    attrs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "a"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "a"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"kind": "File", "path": "/x"},
    ]
    scope = ReadScope("run", iter(attrs))
    assert scope.count(scope_key, ("v1", "ConfigMap", "a")) == 2
    assert scope.count(scope_key, ("v1", "Namespace", None)) == 1
    assert scope.count(lambda a: a.get("kind"), "File") == 1
    assert scope.run_count(scope_key, ("v1", "ConfigMap", "a")) == 2  # the run is the batch
    run = ReadScope("run", attrs, run_size=40)  # ten batches like this one
    assert run.run_count(scope_key, ("v1", "ConfigMap", "a")) == 20
    assert run.count(scope_key, ("v1", "ConfigMap", "a")) == 2
    # a batch of one runtime's queue: its 4 of a 40-resource slice of a 400-resource run
    queued = ReadScope("run", attrs, run_size=400, span=40)
    assert queued.run_count(scope_key, ("v1", "ConfigMap", "a")) == 20


@pytest.fixture
def broken_entry_point(tmp_path: Path) -> Iterator[None]:
    dist = tmp_path / "broken_runtime-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-runtime\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbroken = json:dumps\n")
    sys.path.insert(0, str(tmp_path))
    reload_runtimes()
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        reload_runtimes()


def test_an_entry_point_that_is_no_runtime_names_itself(broken_entry_point: None) -> None:
    with pytest.raises(RuntimeLoadError, match=r"'broken' \(json:dumps\) is not a RuntimeRules"):
        all_rules()


def test_a_stale_install_still_finds_the_declared_built_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A virtualenv installed before pyproject.toml declared a runtime has no such entry
    point in its metadata: the checkout's declaration is read instead."""
    import stackflow.model.runtime_rules as runtime_rules

    monkeypatch.setattr(runtime_rules, "entry_points", lambda group: [])
    reload_runtimes()
    try:
        assert {"Kubernetes", "OnPrem", "Terraform"} <= set(all_rules())
    finally:
        monkeypatch.undo()
        reload_runtimes()
