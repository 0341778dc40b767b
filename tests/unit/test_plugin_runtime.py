"""What a plug-in runtime (tests/fixtures/ledger_runtime) gets from its rules alone, with no
core file naming it: a runtime built from the class path its rules name, a task queue and a
``--runtimes`` name, a section of the worker policy file (narrowed per project, unknown keys
and sections still refused), and its grouping on the plan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from stackflow.activities.prepare import plan_grouping
from stackflow.model.plan import PlannedNode
from stackflow.model.runtime_rules import RuntimeLoadError, RuntimeRules, all_rules
from stackflow.runtimes.policy import PolicyConfigError, WorkerPolicy, load_policy
from stackflow.runtimes.registry import build, default_registry
from stackflow.temporal.operation import BatchInput, GroupSizing
from stackflow.temporal.runtime_queues import runtime_names, runtime_queues, serving
from stackflow.workflows.nodes import Sizing
from stackflow.workflows.nodes import plan_grouping as walk_grouping
from tests.fixtures.ledger_install import ledger_runtime_installed

ON = {"STACKFLOW_RUNTIME_QUEUES": "on"}


@pytest.fixture
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with ledger_runtime_installed(tmp_path_factory.mktemp("ledger-runtime")):
        yield


def policy(tmp_path: Path, doc: dict[str, Any]) -> WorkerPolicy:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_policy({"HOME": str(tmp_path), "STACKFLOW_POLICY_FILE": str(file)})


def refused(tmp_path: Path, doc: dict[str, Any], match: str) -> None:
    with pytest.raises(PolicyConfigError, match=match):
        policy(tmp_path, doc)


@pytest.mark.usefixtures("ledger")
def test_the_registry_builds_the_runtime_its_rules_name() -> None:
    from ledger_runtime.runtime import LedgerRuntime

    assert type(default_registry().get("Ledger")) is LedgerRuntime
    assert all_rules()["Ledger"].runtime_name == "ledger"


def test_rules_naming_no_runtime_class_are_refused() -> None:
    class Nowhere(RuntimeRules):
        type_name: ClassVar[str] = "Nowhere"
        runtime: ClassVar[str] = "no_such_package.runtime:Nothing"

    with pytest.raises(
        RuntimeLoadError, match=r"type 'Nowhere' \(no_such_package.runtime:Nothing\) does not load"
    ):
        build(Nowhere(), None)


@pytest.mark.usefixtures("ledger")
def test_its_task_queue_and_worker() -> None:
    assert runtime_names()["ledger"] == "Ledger"
    assert runtime_queues("q", ON)["Ledger"] == "q-ledger"
    assert runtime_queues("q", {"STACKFLOW_RUNTIME_QUEUES": "ledger=books"}) == {"Ledger": "books"}
    serves = serving("q", "main,ledger", ON)
    assert serves.main and serves.types == {"Ledger"} and serves.queues == {"q-ledger": "Ledger"}


@pytest.mark.usefixtures("ledger")
def test_its_policy_section(tmp_path: Path) -> None:
    from ledger_runtime.policy import LedgerPolicy

    defaults = policy(tmp_path, {})
    assert defaults.section("ledger", LedgerPolicy) == LedgerPolicy()
    worker = policy(
        tmp_path,
        {
            "ledger": {"directory": "/books", "max_amount": 10},
            "projects": {"small-*": {"ledger": {"max_amount": 5}}, "*": None},
        },
    )
    assert worker.section("ledger", LedgerPolicy).max_amount == 10
    small = worker.for_project("small-one", "ledger:x").section("ledger", LedgerPolicy)
    assert small == LedgerPolicy(directory="/books", max_amount=5)
    assert worker.for_project("big", "ledger:x").section("ledger", LedgerPolicy).max_amount == 10
    assert "runtime sections ledger" in worker.summary()
    assert "small-* (ledger.max_amount=5)" in worker.summary()
    # the built-ins' sections are reached the same way
    assert worker.section("onprem", type(worker.onprem)) is worker.onprem

    refused(tmp_path, {"ledgr": {}}, r"policy\.yaml: ledgr: Extra inputs are not permitted")
    refused(tmp_path, {"ledger": {"bogus": 1}}, r"ledger\.bogus: Extra inputs")
    refused(tmp_path, {"ledger": ["x"]}, r"ledger must be a mapping")
    wider = {"ledger": {"max_amount": 10}, "projects": {"p": {"ledger": {"max_amount": 20}}}}
    refused(tmp_path, wider, r"projects\.p\.ledger\.max_amount: 20 is more than the worker's 10")
    whole = {"projects": {"p": {"ledger": {"directory": "/x"}}}}
    refused(tmp_path, whole, r"projects\.p\.ledger\.directory: applies to the whole worker")


def test_without_the_runtime_its_section_is_unknown(tmp_path: Path) -> None:
    refused(tmp_path, {"ledger": {}}, r"ledger: Extra inputs are not permitted")


@pytest.mark.usefixtures("ledger")
def test_its_grouping_goes_on_the_plan_and_the_walk_reads_it() -> None:
    grouping = plan_grouping(["Ledger", "OnPrem"])
    assert grouping["Ledger"] == GroupSizing(limit=3)
    batch = BatchInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=None,
        operation="apply",
        plan_ref="ref",
        start=0,
        actions="",
        grouping=grouping,
    )
    nodes = [PlannedNode(id="ledger:a", type="Ledger"), PlannedNode(id="k", type="Kubernetes")]
    types, sizing = walk_grouping(batch, nodes)
    assert types == ("Ledger", "OnPrem") and sizing == {"Ledger": Sizing(3)}
