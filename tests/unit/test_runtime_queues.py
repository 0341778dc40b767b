"""Workers per runtime: the routing settings, what a worker serves, and how a preview range
split between runtime queues comes back together."""

from __future__ import annotations

import pytest

from stackflow.temporal.activity_io import PreviewBatchResult
from stackflow.temporal.runtime_queues import (
    RoutingError,
    no_worker_message,
    parts,
    plan_queues,
    queue_wait,
    runtime_queues,
    serving,
)
from stackflow.temporal.wire import NOT_MINE

ON = {"STACKFLOW_RUNTIME_QUEUES": "on"}


def test_routing_is_off_by_default_and_named_after_the_main_queue_when_on() -> None:
    assert runtime_queues("stackflow", {}) == {}
    assert runtime_queues("stackflow", {"STACKFLOW_RUNTIME_QUEUES": "off"}) == {}
    assert runtime_queues("stackflow", ON) == {
        "Kubernetes": "stackflow-kubernetes",
        "Terraform": "stackflow-terraform",
        "OnPrem": "stackflow-onprem",
    }
    named = runtime_queues("x", {"STACKFLOW_RUNTIME_QUEUES": "terraform=tf, kubernetes=kube"})
    assert named == {"Terraform": "tf", "Kubernetes": "kube"}
    for bad in ("helm=q", "terraform", "terraform="):
        with pytest.raises(RoutingError, match="STACKFLOW_RUNTIME_QUEUES"):
            runtime_queues("x", {"STACKFLOW_RUNTIME_QUEUES": bad})
    assert queue_wait({}) == 300.0 and queue_wait({"STACKFLOW_RUNTIME_QUEUE_TIMEOUT": "5"}) == 5.0
    with pytest.raises(RoutingError):
        queue_wait({"STACKFLOW_RUNTIME_QUEUE_TIMEOUT": "-1"})


def test_what_a_worker_serves() -> None:
    every = serving("q", None, {})
    assert every.main and every.types is None and every.task_queues("q") == ["q"]
    main = serving("q", "main", ON)
    assert main.main and main.types == frozenset() and main.task_queues("q") == ["q"]
    kube = serving("q", "kubernetes", ON)
    assert not kube.main and kube.types == {"Kubernetes"}
    assert kube.task_queues("q") == ["q-kubernetes"]
    both = serving("q", "main,terraform", ON)
    assert both.task_queues("q") == ["q", "q-terraform"]
    assert serving("q", None, {**ON, "STACKFLOW_WORKER_RUNTIMES": "onprem"}).types == {"OnPrem"}
    with pytest.raises(RoutingError, match="needs per-runtime task queues"):
        serving("q", "kubernetes", {})
    with pytest.raises(RoutingError, match="expected 'all'"):
        serving("q", "kubernetes,helm", ON)


def test_a_plan_carries_only_its_own_types_and_a_range_splits_by_queue() -> None:
    queues = runtime_queues("q", ON)
    assert plan_queues(["OnPrem", "OnPrem"], {}) == {}
    assert plan_queues(["OnPrem", "Custom"], queues) == {"Custom": "", "OnPrem": "q-onprem"}
    assert parts({}) == [(None, None)]
    assert parts({"OnPrem": "q-onprem"}) == [("q-onprem", None)]
    mixed = plan_queues(["Kubernetes", "Terraform", "Custom"], queues)
    assert parts(mixed) == [
        (None, ["Custom"]),
        ("q-kubernetes", ["Kubernetes"]),
        ("q-terraform", ["Terraform"]),
    ]


def test_a_ranges_parts_merge_into_one_result() -> None:
    kube = PreviewBatchResult(
        codes="C0N0", details=[{"id": "k1"}, {"id": "k2"}], refs=[(4, 0, "a")], diff_ref="d1"
    ).spread([0, 3], 4)
    tf = PreviewBatchResult(codes="U1", details=[{"id": "t"}], diff_ref="d2").spread([1], 4)
    gone = PreviewBatchResult(codes="D0", details=[{"id": "g"}]).spread([2], 4)
    assert kube.codes == f"C0{NOT_MINE}{NOT_MINE}N0"
    merged = PreviewBatchResult.merge([kube, tf, gone])
    assert merged.codes == "C0U1D0N0"
    assert [d["id"] for d in merged.details] == ["k1", "t", "g", "k2"]
    assert merged.refs == [(4, 0, "a")]
    assert (merged.diff_ref, merged.more_diff_refs) == ("d1", ["d2"])
    with pytest.raises(ValueError, match="answered by 2"):
        PreviewBatchResult.merge([kube, kube.model_copy()])
    assert PreviewBatchResult.merge([tf]) is tf


def test_the_line_of_a_queue_nobody_polls_names_it() -> None:
    line = no_worker_message("q-terraform", "Terraform", 5)
    assert "'q-terraform'" in line and "within 5s" in line
    assert "stackflow worker --runtimes terraform" in line


def test_hosts_pinned_to_queues_route_their_nodes_and_their_workers_poll_only_them() -> None:
    from stackflow.runtimes.onprem.rules import RULES
    from stackflow.temporal.runtime_queues import route

    env = {"STACKFLOW_RUNTIME_QUEUES": "on,onprem@dc1-*=zone1,onprem@db9=zone2"}
    queues = runtime_queues("sf", env)
    assert queues["OnPrem@dc1-*"] == "zone1" and queues["OnPrem"] == "sf-onprem"
    place = RULES.place
    assert place({"host": "ssh://deploy@dc1-web:2222"}) == "dc1-web" and place({}) is None
    assert route("OnPrem", place({"host": "dc1-db"}), queues) == "OnPrem@dc1-*"
    assert route("OnPrem", place({"host": "db9"}), queues) == "OnPrem@db9"
    assert route("OnPrem", place({"host": "web"}), queues) is None
    assert route("Kubernetes", "dc1-x", queues) is None
    assert plan_queues(["OnPrem", "OnPrem@db9"], queues) == {
        "OnPrem": "sf-onprem",
        "OnPrem@db9": "zone2",
    }
    zone = serving("sf", "onprem@dc1-*", env)
    assert zone.queues == {"zone1": "OnPrem"} and not zone.main
    assert zone.types == frozenset({"OnPrem"})
    assert set(serving("sf", None, env).queues) >= {"zone1", "zone2", "sf-onprem"}
    with pytest.raises(RoutingError, match="onprem@dc1-"):
        serving("sf", "onprem@dc2-*", env)
    with pytest.raises(RoutingError, match="STACKFLOW_RUNTIME_QUEUES"):
        runtime_queues("sf", {"STACKFLOW_RUNTIME_QUEUES": "onprem@=q"})
