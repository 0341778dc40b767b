"""Pure parts of the Kubernetes runtime: ids, markers, conflict paths, drift rule, readiness."""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes.client import ApiException

from stackflow.runtimes.base import (
    Conflict,
    InvalidInput,
    NotFound,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.kubernetes.client import (
    ApiError,
    api_service_waiting,
    crd_state,
    encode_body,
    transport_failure,
)
from stackflow.runtimes.kubernetes.failures import failure
from stackflow.runtimes.kubernetes.manifest import (
    MISSING,
    check_id,
    conflict_fields,
    desired_object,
    drift_repair,
    lookup,
    object_ref,
    shaped_like,
)
from stackflow.runtimes.kubernetes.readiness import parse_timeout, readiness

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


RID = "apps/v1:Deployment:default:web"
SERVER = "https://10.0.0.1:6443"


def api_error(status: int, message: str, reason: str = "", **details: Any) -> ApiError:
    body: dict[str, Any] = {"kind": "Status", "message": message, "reason": reason, "code": status}
    if details:
        body["details"] = details
    return ApiError(status, body, "", SERVER)


def test_typed_patch_errors_are_invalid_input_naming_the_field() -> None:
    # what server-side apply answers for replicas: "1" (a 500, yet no retry can help)
    exc = failure(
        api_error(
            500,
            "failed to create typed patch object (default/web; apps/v1, Kind=Deployment): "
            ".spec.replicas: expected numeric (int or float), got string",
        ),
        RID,
        "apply of Deployment default/web",
    )
    assert type(exc) is InvalidInput and not exc.retryable and exc.resource_id == RID
    assert str(exc) == f"{RID}: .spec.replicas: expected numeric (int or float), got string"


def test_several_typed_patch_errors_are_one_line() -> None:
    message = (
        "failed to create typed patch object (default/web; apps/v1, Kind=Deployment): errors:\n"
        "  .spec.paused: expected boolean, got &{yes}\n"
        "  .spec.replicas: expected numeric (int or float), got string\n"
        "  .spec.bogus: field not declared in schema"
    )
    exc = failure(api_error(500, message), RID, "apply")
    assert type(exc) is InvalidInput
    assert str(exc) == (
        f"{RID}: .spec.paused: expected boolean, got yes; .spec.replicas: expected numeric "
        "(int or float), got string; .spec.bogus: field not declared in schema"
    )


def test_typed_live_object_errors_are_not_retried_either() -> None:
    message = "failed to create typed live object (ns/w; x/v1, Kind=W): .spec.size: expected int"
    exc = failure(api_error(500, message), RID, "apply of W ns/w")
    assert type(exc) is InvalidInput and "live object does not match its schema" in str(exc)
    assert ".spec.size: expected int" in str(exc)


def test_invalid_names_the_fields_of_the_causes() -> None:
    exc = failure(
        api_error(
            422,
            'Deployment.apps "web" is invalid: [spec.replicas: Invalid value: -1: must be '
            "greater than or equal to 0, spec.template.spec.containers: Required value]",
            "Invalid",
            causes=[
                {"reason": "FieldValueInvalid", "field": "spec.replicas"},
                {"reason": "FieldValueRequired", "field": "spec.template.spec.containers"},
                {"reason": "FieldValueRequired", "field": "spec.replicas"},
            ],
        ),
        RID,
        "dry-run apply of Deployment default/web",
    )
    assert type(exc) is InvalidInput
    assert str(exc).startswith(
        f"{RID}: dry-run apply of Deployment default/web rejected by the API server, "
        'invalid spec.replicas, spec.template.spec.containers: Deployment.apps "web" is invalid'
    )


@pytest.mark.parametrize("status", [401, 403])
def test_permissions_are_invalid_input_saying_retrying_will_not_help(status: int) -> None:
    message = 'configmaps "x" is forbidden: User "bob" cannot patch resource "configmaps"'
    exc = failure(api_error(status, message, "Forbidden"), RID, "apply")
    assert type(exc) is InvalidInput and not exc.retryable
    assert message in str(exc) and "retrying will not help" in str(exc)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (502, ""),
        (503, "ServiceUnavailable"),
        (504, "Timeout"),
        (408, "Timeout"),
    ],
)
def test_server_trouble_is_unavailable_naming_the_server(status: int, reason: str) -> None:
    exc = failure(api_error(status, "try later", reason), RID, "apply")
    assert type(exc) is Unavailable and exc.retryable
    answered = f"{status} {reason}".strip()
    assert str(exc) == f"{RID}: apply: Kubernetes API {SERVER} answered {answered}: try later"


def test_conflicts_and_bad_requests() -> None:
    exists = failure(api_error(409, 'configmaps "x" already exists', "AlreadyExists"), RID, "x")
    assert type(exists) is Conflict
    bad = failure(
        api_error(
            400, "the name of the object (a) does not match the name on the URL (b)", "BadRequest"
        ),
        RID,
        "apply",
    )
    assert type(bad) is InvalidInput and "rejected by the API server: the name" in str(bad)
    assert "\n" not in str(failure(api_error(400, "line one\nline two"), RID, "apply"))


def test_encode_body_is_utf8_json_that_yaml_reads_alike() -> None:
    value = "crème brûlée 🍰 \x7f\x85\x9f\u2028\u2029\ufeff\t\n\\\"'"
    body = {"data": {"menu": value}, "k🍰": 1}
    raw = encode_body(body)
    assert "crème brûlée 🍰".encode() in raw  # UTF-8, no \\ud83c\\udf70 surrogate escapes
    assert b"\\ud8" not in raw and b"\\ud" not in raw
    assert json.loads(raw) == body
    assert yaml.safe_load(raw.decode()) == body  # YAML: no raw control characters or breaks
    with pytest.raises(InvalidInput, match=r"\\udcc3, half of a UTF-16 surrogate pair"):
        encode_body({"name": "caf\udcc3"})


def test_transport_failures() -> None:
    refused = urllib3.exceptions.MaxRetryError(
        None,  # type: ignore[arg-type]
        "/api",
        urllib3.exceptions.NewConnectionError(
            None,  # type: ignore[arg-type]
            "Failed to establish a new connection: [Errno 111] Connection refused",
        ),
    )
    exc = transport_failure(refused, "https://127.0.0.1:1")
    assert type(exc) is Unavailable
    assert str(exc).startswith("Kubernetes API https://127.0.0.1:1 unreachable: ")
    assert "Connection refused" in str(exc)
    untrusted = urllib3.exceptions.MaxRetryError(
        None,  # type: ignore[arg-type]
        "/api",
        urllib3.exceptions.SSLError(
            ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed")
        ),
    )
    assert type(transport_failure(untrusted, SERVER)) is InvalidInput
    # the kubernetes client turns urllib3's SSLError into an ApiException with status 0
    wrapped = ApiException(status=0, reason="SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] bad")
    assert "retrying will not help" in str(transport_failure(wrapped, SERVER))
    reset = ApiException(status=0, reason="ProtocolError\nConnection reset by peer")
    assert type(transport_failure(reset, SERVER)) is Unavailable


def _crd(served: list[str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "widgets.example.com"},
        "spec": {"versions": [{"name": v, "served": True} for v in served]},
        "status": status,
    }


def test_why_a_custom_kind_is_not_served() -> None:
    assert crd_state(_crd(["v1"]), "v1") == (
        "its CustomResourceDefinition widgets.example.com is not established yet",
        True,
    )
    assert crd_state(_crd(["v1", "v2"]), "v3") == (
        "its CustomResourceDefinition widgets.example.com serves v1, v2, not v3",
        False,
    )
    refused = {"type": "NamesAccepted", "status": "False", "message": "kind Widget taken"}
    reason, soon = crd_state(_crd(["v1"], conditions=[refused]), "v1")
    assert not soon and reason.endswith("is not accepted: kind Widget taken")
    assert api_service_waiting({"spec": {"service": None}}) is None  # built-in group
    down = {"type": "Available", "status": "False", "message": "endpoints not found"}
    remote = {"spec": {"service": {"name": "metrics"}}, "status": {"conditions": [down]}}
    assert api_service_waiting(remote) == "endpoints not found"


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


def test_leaf_kinds_delete_in_the_background_workloads_in_the_foreground() -> None:
    from stackflow.runtimes.kubernetes.failures import default_propagation
    from stackflow.runtimes.kubernetes.manifest import ObjectRef

    def ref(api_version: str, kind: str) -> ObjectRef:
        return ObjectRef(api_version=api_version, kind=kind, namespace="ns", name="x")

    assert default_propagation(ref("v1", "ConfigMap")) == "Background"
    assert default_propagation(ref("v1", "Namespace")) == "Background"
    assert default_propagation(ref("rbac.authorization.k8s.io/v1", "Role")) == "Background"
    # Kubernetes' own kinds that own pods or other objects go dependents first
    assert default_propagation(ref("apps/v1", "Deployment")) == "Foreground"
    assert default_propagation(ref("batch/v1", "Job")) == "Foreground"
    assert default_propagation(ref("gateway.networking.k8s.io/v1", "Gateway")) == "Foreground"
    # custom kinds as kubectl deletes them: the garbage collector may not know them yet
    assert default_propagation(ref("example.com/v1", "Widget")) == "Background"
    assert default_propagation(ref("cert-manager.io/v1", "Issuer")) == "Background"


def test_a_delete_answered_with_success_for_the_same_uid_needs_no_wait() -> None:
    from stackflow.runtimes.kubernetes.failures import deleted_at_once

    gone = {"kind": "Status", "status": "Success", "details": {"name": "c", "uid": "u1"}}
    assert deleted_at_once(gone, "u1")
    assert not deleted_at_once(gone, "u2")  # another object's answer proves nothing
    assert not deleted_at_once(gone, "")
    pending = {"kind": "ConfigMap", "metadata": {"uid": "u1", "deletionTimestamp": "now"}}
    assert not deleted_at_once(pending, "u1")  # deferred (finalizers, grace): waited for


def test_the_credential_refresh_stays_throttled_after_it_ran(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubeconfig loader's refresh hook re-sets the whole configuration, its own hook
    included: the throttle must survive that, or every request after the first second runs
    the loader again (it did: a twentieth of the worker's CPU in a 1,000-object apply)."""
    from kubernetes.config.kube_config import KubeConfigLoader

    from stackflow.runtimes.kubernetes import client as kube_client

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t0"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    runs: list[int] = []
    original = KubeConfigLoader._set_config

    def counted(self: Any, configuration: Any) -> None:
        runs.append(1)
        original(self, configuration)

    monkeypatch.setattr(KubeConfigLoader, "_set_config", counted)
    now = [1000.0]
    monkeypatch.setattr(kube_client.time, "monotonic", lambda: now[0])
    cfg = kube_client.connect(str(kubeconfig), None).api.configuration
    runs.clear()
    for second in range(3):
        for _ in range(5):
            auth = cfg.auth_settings()
            assert auth["BearerToken"]["value"] == "Bearer t0"
        assert len(runs) == second + 1  # once a second, however many requests
        now[0] += kube_client.REFRESH_SECONDS


def test_fresh_namespaces_are_one_runs_evidence_for_each_objects_first_apply() -> None:
    """What a run's Namespace apply answered 201 proves: for that run, that client and that
    namespace only, once per object; the oldest namespaces are forgotten past SIZE."""
    from stackflow.core.refs import RunRef
    from stackflow.runtimes.kubernetes.client import ApiResource, KubeClient
    from stackflow.runtimes.kubernetes.fresh import FreshNamespaces

    client = KubeClient(api=None, label="test")  # type: ignore[arg-type]
    other_client = KubeClient(api=None, label="other")  # type: ignore[arg-type]
    maps = ApiResource(api_version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
    run, later = RunRef("apply-x", "r1"), RunRef("apply-x", "r2")
    opts = RuntimeOptions(project="p", workspace="w", owner=run)

    def claim(name: str, ns: str = "fresh", options: RuntimeOptions = opts, **ext: Any) -> bool:
        req = ResourceRequest(
            id=f"v1:ConfigMap:{ns}:{name}",
            type="Kubernetes",
            attributes={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns},
            },
            extensions=ext,
        )
        return made.claim_for(on, maps, object_ref(req), req, options)

    made, on = FreshNamespaces(), client
    assert not claim("a")  # nothing made yet
    made.add(id(client), "fresh", run)
    assert claim("a") and not claim("a")  # the first apply only
    assert claim("b") and not claim("c", ns="elsewhere")
    assert not claim("d", options=opts.model_copy(update={"owner": later}))
    assert not claim("d", options=opts.model_copy(update={"owner": None}))
    assert not claim("d", adopt=True) and not claim("d", force=True)
    assert not claim("kube-root-ca.crt")
    on = other_client
    assert not claim("d")
    on = client
    assert claim("d")
    for i in range(FreshNamespaces.SIZE):
        made.add(id(client), f"ns{i}", run)
    assert not claim("e")  # forgotten: read first, as for any namespace


def test_an_object_that_appeared_fails_as_conflict_even_when_its_withdrawal_gets_no_answer() -> (
    None
):
    """A withdrawal cut off by the network must not turn into a retry (the retry would read
    the object with this stack's markers and take it as its own): still Conflict, saying so."""
    from stackflow.runtimes.kubernetes.client import ApiResource, KubeClient
    from stackflow.runtimes.kubernetes.fresh import appeared

    class Unreachable(KubeClient):
        def exchange(self, method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
            raise Unavailable("Kubernetes API https://127.0.0.1:1: connection refused")

    maps = ApiResource(api_version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
    req = ResourceRequest(
        id="v1:ConfigMap:fresh:c",
        type="Kubernetes",
        attributes={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "fresh"},
        },
    )
    client = Unreachable(api=None, label="test")  # type: ignore[arg-type]
    with pytest.raises(
        Conflict, match=r"appeared in namespace fresh.*withdrawing .* failed: .*refused"
    ):
        appeared(client, maps, object_ref(req), req)


def test_previewed_shows_the_spec_fields_and_what_else_the_apply_changes() -> None:
    from stackflow.runtimes.kubernetes.manifest import previewed

    desired = {"spec": {"type": "NodePort", "ports": [{"port": 80}]}}
    live = {
        "metadata": {"resourceVersion": "5", "uid": "u"},
        "spec": {"type": "ClusterIP", "ports": [{"port": 80}], "replicas": 2, "old": "x"},
        "status": {"ready": True},
    }
    result = {
        "metadata": {"resourceVersion": "5", "uid": "u", "generation": 2},
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}], "replicas": 1},
        "status": {"ready": False},
    }
    would_be, removed = previewed(desired, live, result) or ({}, [])
    assert would_be == {
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}], "replicas": 1}
    }
    assert removed == ["spec.old"]
    # the object changed since it was read: not the one the dry run merged onto
    assert previewed(desired, {**live, "metadata": {"resourceVersion": "6"}}, result) is None
    # a create shows the fields the spec sets
    assert previewed(desired, None, result) == (
        {"spec": {"type": "NodePort", "ports": [{"port": 80}]}},
        [],
    )
