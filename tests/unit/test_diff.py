"""Three-way diff: actions, projection, drift, ignore_fields, masking, stable JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stackflow.engine.diff import Action, Change, FieldChange, Preview, diff_resource, project
from stackflow.engine.masking import SENSITIVE_MARKER, sensitive_paths_for

KUSION = Path(__file__).resolve().parents[3] / "shared" / "compat" / "kusion"
SVC = "v1:Service:code-city:gocity"


def service_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    plan = yaml.safe_load((KUSION / "runtime/kubernetes/testdata/plan_service.yaml").read_text())
    live = yaml.safe_load((KUSION / "runtime/kubernetes/testdata/live_service.yaml").read_text())
    return plan["attributes"], live


def paths(change: Change) -> list[str]:
    return [f.path for f in change.diff]


def test_kusion_live_service_is_unchanged_against_its_plan() -> None:
    desired, live = service_pair()
    change = diff_resource(SVC, "Kubernetes", desired, live, desired)
    assert change.action is Action.UnChanged and change.diff == [] and not change.drift


def test_update_reports_only_managed_fields() -> None:
    desired, live = service_pair()
    desired["spec"]["ports"][0]["port"] = 4001
    change = diff_resource(SVC, "Kubernetes", desired, live, live)
    assert change.action is Action.Update
    assert change.diff == [FieldChange(path="spec.ports[0].port", old=4000, new=4001)]
    assert not change.drift  # the spec changed it


def test_create_when_not_live() -> None:
    change = diff_resource("a", "OnPrem", {"x": {"y": [1, 2]}, "e": {}}, None, None)
    assert change.action is Action.Create and not change.drift
    assert [(f.path, f.old, f.new) for f in change.diff] == [
        ("x.y[0]", None, 1),
        ("x.y[1]", None, 2),
        ("e", None, {}),
    ]


def test_create_with_prior_is_drift() -> None:
    change = diff_resource("a", "OnPrem", {"x": 1}, None, {"x": 1})
    assert change.action is Action.Create and change.drift


def test_delete_when_no_longer_in_spec() -> None:
    change = diff_resource("a", "OnPrem", None, {"x": 1}, {"x": 1})
    assert change.action is Action.Delete
    assert change.diff == [FieldChange(path="x", old=1, new=None)]
    gone = diff_resource("a", "OnPrem", None, None, {"x": 1})  # already gone: still a Delete
    assert gone.action is Action.Delete and gone.diff[0].old == 1
    assert diff_resource("a", "OnPrem", None, None, None).action is Action.UnChanged


def test_drift_when_live_moved_but_spec_did_not() -> None:
    desired = {"replicas": 3, "image": "v2"}
    prior = {"replicas": 3, "image": "v1"}
    live = {"replicas": 5, "image": "v1", "status": "x"}
    change = diff_resource("a", "OnPrem", desired, live, prior)
    assert change.action is Action.Update and change.drift
    assert paths(change) == ["image", "replicas"]
    # only the spec's own change: no drift
    assert not diff_resource("a", "OnPrem", desired, prior, prior).drift
    # no prior: adopting an existing object is not drift
    assert not diff_resource("a", "OnPrem", desired, live, None).drift


def test_drift_only_on_managed_fields() -> None:
    desired = {"a": 1}
    change = diff_resource("x", "OnPrem", desired, {"a": 1, "b": 9}, {"a": 1, "b": 1})
    assert change.action is Action.UnChanged and not change.drift


def test_list_projection_and_length() -> None:
    assert project([{"a": 1, "z": 0}, {"a": 2}], [{"a": 1}]) == [{"a": 1}, {"a": 2}]
    change = diff_resource("x", "OnPrem", {"l": [1]}, {"l": [1, 2]}, None)
    assert [(f.path, f.old, f.new) for f in change.diff] == [("l[1]", 2, None)]


def test_missing_key_in_live_and_type_change() -> None:
    change = diff_resource("x", "OnPrem", {"a": {"b": 1}, "c": "s"}, {"c": {"k": 1}}, None)
    assert [(f.path, f.old, f.new) for f in change.diff] == [
        ("a.b", None, 1),
        ("c", {"k": 1}, "s"),
    ]


def test_ignore_fields() -> None:
    desired = {
        "metadata": {"annotations": {"a": "1"}, "name": "n"},
        "spec": {"ports": [{"nodePort": 1, "port": 80}]},
    }
    live = {
        "metadata": {"annotations": {"a": "2"}, "name": "n"},
        "spec": {"ports": [{"nodePort": 2, "port": 80}]},
    }
    change = diff_resource(
        "x",
        "OnPrem",
        desired,
        live,
        None,
        ignore_fields=["metadata.annotations", "spec.ports[*].nodePort"],
    )
    assert change.action is Action.UnChanged
    change = diff_resource(
        "x", "OnPrem", desired, live, None, ignore_fields=["metadata.annotations"]
    )
    assert paths(change) == ["spec.ports[0].nodePort"]


def test_labels_with_dots_in_paths() -> None:
    change = diff_resource(
        "x",
        "OnPrem",
        {"labels": {"app.kubernetes.io/name": "a"}},
        {"labels": {"app.kubernetes.io/name": "b"}},
        None,
    )
    assert paths(change) == ['labels["app.kubernetes.io/name"]']


def test_secret_values_masked() -> None:
    desired = {"kind": "Secret", "data": {"password": "bmV3", "user": "YQ=="}, "type": "Opaque"}
    live = {"kind": "Secret", "data": {"password": "b2xk", "user": "YQ=="}, "type": "Opaque"}
    sensitive = sensitive_paths_for("Kubernetes", desired)
    assert sensitive == ["data", "stringData"]
    change = diff_resource(
        "v1:Secret:ns:s", "Kubernetes", desired, live, None, sensitive_paths=sensitive
    )
    assert change.diff == [
        FieldChange(path="data.password", old=SENSITIVE_MARKER, new=SENSITIVE_MARKER)
    ]
    created = diff_resource(
        "v1:Secret:ns:s", "Kubernetes", desired, None, None, sensitive_paths=sensitive
    )
    dumped = json.dumps(created.model_dump())
    assert "bmV3" not in dumped and "YQ==" not in dumped
    assert {f.path: f.new for f in created.diff}["type"] == "Opaque"
    deleted = diff_resource(
        "v1:Secret:ns:s", "Kubernetes", None, live, live, sensitive_paths=sensitive
    )
    assert "b2xk" not in json.dumps(deleted.model_dump())


def test_masking_inside_a_whole_value() -> None:
    # the whole "outputs" map is one change (a type change), with a secret nested inside it
    change = diff_resource(
        "t",
        "Terraform",
        {"outputs": {"pw": "new", "x": 1}},
        {"outputs": "old"},
        None,
        sensitive_paths=["outputs.pw"],
    )
    assert change.diff == [
        FieldChange(path="outputs", old="old", new={"pw": SENSITIVE_MARKER, "x": 1})
    ]
    assert sensitive_paths_for("Kubernetes", {"kind": "ConfigMap"}) == []


def test_preview_json_is_stable() -> None:
    preview = Preview(
        changes=[
            diff_resource("a", "OnPrem", {"x": 1}, None, None),
            diff_resource("b", "OnPrem", {"x": 1}, {"x": 1}, {"x": 1}),
            diff_resource("c", "OnPrem", None, {"x": 1}, {"x": 1}),
        ]
    )
    out = preview.to_json()
    assert list(out) == ["changes", "summary"]
    assert out["summary"] == {"Create": 1, "Update": 0, "Delete": 1, "UnChanged": 1}
    assert list(out["summary"]) == ["Create", "Update", "Delete", "UnChanged"]
    assert out["changes"][0] == {
        "id": "a",
        "type": "OnPrem",
        "action": "Create",
        "drift": False,
        "diff": [{"path": "x", "old": None, "new": 1}],
    }
    assert json.loads(json.dumps(out)) == out
    assert preview.has_changes
    assert Preview(changes=[]).summary == {"Create": 0, "Update": 0, "Delete": 0, "UnChanged": 0}


def test_numbers_compare_like_json() -> None:
    change = diff_resource("x", "OnPrem", {"a": 1, "b": 2}, {"a": 1.0, "b": 3}, None)
    assert [(f.path, f.old, f.new) for f in change.diff] == [("b", 3, 2)]
    assert diff_resource("x", "OnPrem", {"a": 1}, {"a": 1.0}, None).action is Action.UnChanged


def test_taint_follows_references_to_sensitive_values() -> None:
    from stackflow.engine.masking import tainted_paths

    deps = {
        "tf:pw": ("Terraform", {"result": "hunter2", "_stackflow_sensitive": ["result"]}),
        "v1:Secret:ns:s": ("Kubernetes", {"kind": "Secret", "data": {"k": "djE="}}),
        "plain": ("OnPrem", {"path": "/x", "content": "public"}),
    }
    attributes = {
        "content": "$kusion_path.tf:pw.result",
        "env": [{"value": "$kusion_path.v1:Secret:ns:s.data.k"}],
        "whole": "$kusion_path.v1:Secret:ns:s",
        "public": "$kusion_path.plain.content",
        "literal": "not a reference",
    }
    assert tainted_paths(attributes, deps) == ["content", "env[0].value", "whole"]
    assert tainted_paths({"a": "$kusion_path.plain.path"}, deps) == []


def test_removed_paths_show_what_the_apply_removes() -> None:
    """Fields outside desired that the runtime's merge removes show as removed (not drift,
    the spec dropped them); ignored fields, fields live no longer holds and fields already
    compared are left out; a removed sensitive value is masked."""
    live = {
        "data": {"keep": "1", "drop": "2", "secret": "s3cr3t"},
        "metadata": {"labels": {"a": "1", "old": "x"}, "annotations": {"ignored": "y"}},
        "spec": {"nested": {"k": [1, 2]}},
    }
    desired = {"data": {"keep": "1"}, "metadata": {"labels": {"a": "1"}}}
    prior = {**live}
    removed = [
        "data.drop",
        "data.secret",
        "metadata.labels.old",
        "metadata.annotations.ignored",
        "spec.nested",
        "data.gone",
        "data.keep",
    ]
    got = diff_resource(
        "r",
        "Kubernetes",
        desired,
        live,
        prior,
        ignore_fields=["metadata.annotations"],
        sensitive_paths=["data.secret"],
        removed_paths=removed,
    )
    assert got.action == Action.Update and not got.drift
    assert [(d.path, d.old, d.new) for d in got.diff] == [
        ("data.drop", "2", None),
        ("data.secret", SENSITIVE_MARKER, None),
        ("metadata.labels.old", "x", None),
        ("spec.nested.k[0]", 1, None),
        ("spec.nested.k[1]", 2, None),
    ]
    assert diff_resource("r", "Kubernetes", desired, live, prior).action == Action.UnChanged
    drifted = {**live, "data": {**live["data"], "keep": "changed"}}
    both = diff_resource("r", "Kubernetes", desired, drifted, prior, removed_paths=["data.drop"])
    assert both.drift and [d.path for d in both.diff] == ["data.drop", "data.keep"]
