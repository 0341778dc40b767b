"""Pure parts of the Kubernetes runtime: ids, markers, conflict paths, drift rule, readiness."""

from __future__ import annotations

from typing import Any

import pytest

from runtimes.base import (
    Conflict,
    InvalidInput,
    NotFound,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from runtimes.kubernetes.client import ApiError
from runtimes.kubernetes.manifest import (
    MISSING,
    check_id,
    conflict_fields,
    desired_object,
    drift_repair,
    lookup,
    object_ref,
    shaped_like,
)
from runtimes.kubernetes.readiness import parse_timeout, readiness
from runtimes.kubernetes.runtime import failure

OPTS = RuntimeOptions(project="shop", workspace="prod")
DEPLOY: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "ns"},
    "spec": {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [{"name": "app", "image": "a:1"}, {"name": "side", "image": "s:1"}]
            }
        },
        "ports": [{"containerPort": 80, "protocol": "TCP"}],
        "finalizers": ["x", "y"],
    },
}


def req(attrs: dict[str, Any], rid: str | None = None, **ext: Any) -> ResourceRequest:
    return ResourceRequest(
        id=rid or "apps/v1:Deployment:ns:web", type="Kubernetes", attributes=attrs, extensions=ext
    )


def test_ids_follow_the_kusion_convention() -> None:
    r = req(DEPLOY)
    check_id(r, object_ref(r), namespaced=True)
    with pytest.raises(InvalidInput, match="does not match the manifest"):
        bad = req(DEPLOY, rid="apps/v1:Deployment:other:web")
        check_id(bad, object_ref(bad), namespaced=True)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}
    check_id(
        req(ns, rid="v1:Namespace:a"), object_ref(req(ns, rid="v1:Namespace:a")), namespaced=False
    )
    no_ns = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    with pytest.raises(InvalidInput, match="namespaced"):
        check_id(
            req(no_ns, rid="v1:ConfigMap:c"), object_ref(req(no_ns, rid="v1:ConfigMap:c")), True
        )
    with pytest.raises(InvalidInput, match=r"metadata\.name"):
        object_ref(req({"apiVersion": "v1", "kind": "X", "metadata": {}}))


def test_desired_object_adds_markers_and_folds_string_data() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": "n"},
        "stringData": {"p": "hi"},
        "data": {"q": "eA=="},
        "status": {"x": 1},
    }
    out = desired_object(req(secret, rid="v1:Secret:n:s"), OPTS)
    assert (
        out["data"] == {"q": "eA==", "p": "aGk="}
        and "stringData" not in out
        and "status" not in out
    )
    assert out["metadata"]["annotations"] == {
        "stackflow.io/project": "shop",
        "stackflow.io/workspace": "prod",
    }
    assert out["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "stackflow"
    assert secret["stringData"] == {"p": "hi"}  # the spec is not mutated


def test_lookup_reads_structured_merge_diff_paths() -> None:
    assert lookup(DEPLOY, ".spec.replicas") == 2
    assert lookup(DEPLOY, '.spec.template.spec.containers[name="side"].image') == "s:1"
    assert lookup(DEPLOY, '.spec.ports[containerPort=80,protocol="TCP"]') == {
        "containerPort": 80,
        "protocol": "TCP",
    }
    assert lookup(DEPLOY, '.spec.finalizers[="y"]') == "y"
    assert lookup(DEPLOY, ".spec.finalizers[1]") == "y"
    assert lookup(DEPLOY, ".spec.nothing") is MISSING
    assert lookup(DEPLOY, '.spec.template.spec.containers[name="zzz"].image') is MISSING
    assert lookup(DEPLOY, ".spec.replicas.deeper") is MISSING


def test_conflicts_name_managers_and_fields() -> None:
    causes = [
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "kubectl-edit"',
            "field": ".spec.replicas",
        },
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "hpa" with subresource "scale"',
            "field": ".spec.replicas",
        },
    ]
    fields, managers = conflict_fields(causes, "")
    assert fields == [".spec.replicas"] and managers == ["kubectl-edit", "hpa (subresource scale)"]


def test_drift_repair_only_for_fields_stackflow_recorded_with_the_same_value() -> None:
    prior = {"spec": {"replicas": 2}, "metadata": {"labels": {"team": "a"}}}
    assert drift_repair([".spec.replicas"], DEPLOY, prior)
    assert not drift_repair([".spec.replicas"], DEPLOY, None)  # nothing recorded
    assert not drift_repair(
        [".spec.replicas"], DEPLOY, {"spec": {"replicas": 5}}
    )  # spec changed it
    assert not drift_repair([".metadata.labels.team"], DEPLOY, prior)  # spec does not set it
    assert not drift_repair([], DEPLOY, prior)


def test_shaped_like_keeps_only_the_applied_fields() -> None:
    live = {
        "spec": {
            "replicas": 2,
            "strategy": {"type": "RollingUpdate"},
            "containers": [{"name": "a", "imagePullPolicy": "Always"}, {"name": "b"}],
        }
    }
    shape = {"spec": {"replicas": 1, "containers": [{"name": "a"}]}}
    assert shaped_like(live, shape) == {
        "spec": {"replicas": 2, "containers": [{"name": "a"}, {"name": "b"}]}
    }


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, InvalidInput),
        (422, InvalidInput),
        (401, InvalidInput),
        (403, InvalidInput),
        (404, NotFound),
        (409, Conflict),
        (410, Unavailable),
        (429, Unavailable),
        (500, Unavailable),
        (503, Unavailable),
    ],
)
def test_api_errors_map_to_runtime_errors(status: int, error: type[Exception]) -> None:
    exc = failure(ApiError(status, {"message": "boom", "reason": "X"}, ""), "id", "apply")
    assert type(exc) is error and "boom" in str(exc)


def test_namespace_being_terminated_is_retryable() -> None:
    body = {
        "message": 'namespaces "x" is forbidden: unable to create new content in namespace x '
        "because it is being terminated"
    }
    assert isinstance(failure(ApiError(403, body, ""), "id", "apply"), Unavailable)


def _deploy(gen: int, observed: int, **status: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"generation": gen},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": observed, **status},
    }


def test_readiness_rules() -> None:
    assert not readiness(_deploy(2, 1, updatedReplicas=2, replicas=2, availableReplicas=2)).ready
    assert not readiness(_deploy(1, 1, updatedReplicas=1, replicas=2, availableReplicas=1)).ready
    assert not readiness(_deploy(1, 1, updatedReplicas=2, replicas=3, availableReplicas=2)).ready
    assert readiness(_deploy(1, 1, updatedReplicas=2, replicas=2, availableReplicas=2)).ready
    failed_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
        },
    }
    state = readiness(failed_job)
    assert state.failed and "BackoffLimitExceeded" in state.message
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "status": {"phase": "Pending"}}
    assert not readiness(pvc).ready
    assert readiness({"apiVersion": "v1", "kind": "ConfigMap"}).ready
    pending = {
        "apiVersion": "x.io/v1",
        "kind": "Db",
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    assert not readiness(pending).ready and not readiness(pending).failed


def test_readiness_timeout_parsing() -> None:
    assert parse_timeout(None) is None
    assert (
        parse_timeout(30) == 30.0 and parse_timeout("90s") == 90.0 and parse_timeout("5m") == 300.0
    )
    for bad in ("soon", -1, True, "0s"):
        with pytest.raises(ValueError):
            parse_timeout(bad)
