"""The Kubernetes runtime against the real kube-apiserver (+ controller-manager, scheduler, kwok).

Each test works in its own namespace (and CRD group) and removes them afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kubernetes import client as k8s

from stackflow.core.refs import RunRef
from stackflow.engine.diff import Change, diff_resource
from stackflow.engine.masking import sensitive_paths_for
from stackflow.runtimes.base import (
    Conflict,
    InvalidInput,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.kubernetes import KubernetesRuntime, NotReady
from stackflow.runtimes.kubernetes.runtime import DRY_RUN_ATTEMPTS
from tests.integration.kubehelp import (
    config_map,
    crd,
    delete_quietly,
    deployment,
    job,
    namespace,
    request,
    secret,
    service,
    suffix,
    widget,
)

Obj = dict[str, Any]


@pytest.fixture
def opts() -> RuntimeOptions:
    return RuntimeOptions(project=f"p{suffix()}", workspace="dev", timeout_seconds=60)


@pytest.fixture
async def ns(rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient) -> AsyncIterator[str]:
    name = f"sf-{suffix()}"
    await rt.apply(request(namespace(name)), opts)
    yield name
    delete_quietly(api, namespaces=[name])


class Sent(NamedTuple):
    """One request the runtime sent to the API server."""

    method: str
    path: str
    limit: str | None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    """Every request the runtime sends from here on (cleared by a test where it starts)."""
    from stackflow.runtimes.kubernetes.client import KubeClient

    found: list[Sent] = []
    real = KubeClient.exchange  # every request goes through it

    def counted(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
        limit = (kw.get("query") or {}).get("limit")
        found.append(Sent(method, path, None if limit is None else str(limit)))
        return real(self, method, path, **kw)

    monkeypatch.setattr(KubeClient, "exchange", counted)
    return found


async def change(
    rt: KubernetesRuntime, req: ResourceRequest, opts: RuntimeOptions, prior: Obj | None = None
) -> Change:
    """What preview would report for one resource (as the preview activity computes it)."""
    live = await rt.read(req, opts)
    result = await rt.preview(req, opts)
    return diff_resource(
        req.id,
        req.type,
        result.would_be,
        live,
        prior,
        sensitive_paths=result.sensitive_paths + sensitive_paths_for(req.type, req.attributes),
        removed_paths=result.removed_paths,
    )


async def test_apply_then_preview_is_unchanged_and_one_edit_is_one_update(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str
) -> None:
    objs = [
        config_map(ns, "settings", {"mode": "fast"}),
        deployment(ns, "web"),
        service(ns, "web"),
    ]
    for obj in objs:
        assert (await change(rt, request(obj), opts)).action == "Create"
    recorded = {}
    for obj in objs:
        started = time.monotonic()
        recorded[obj["kind"]] = await rt.apply(request(obj), opts)
        assert time.monotonic() - started < 5
    for obj in objs:
        got = await change(rt, request(obj), opts, prior=recorded[obj["kind"]])
        assert got.action == "UnChanged", got
    # read() leaves server bookkeeping out, but keeps defaults (references need clusterIP)
    live = await rt.read(request(objs[2]), opts)
    assert live is not None
    assert "status" not in live and "managedFields" not in live["metadata"]
    assert "resourceVersion" not in live["metadata"] and "uid" not in live["metadata"]
    assert live["spec"]["clusterIP"].startswith("10.0.0.")
    # ownership markers are applied, and never show up as a change
    assert live["metadata"]["annotations"]["stackflow.io/project"] == opts.project
    assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "stackflow"

    edited = deployment(ns, "web", image="nginx:1.27")
    got = await change(rt, request(edited), opts, prior=recorded["Deployment"])
    assert got.action == "Update" and not got.drift
    assert [(d.path, d.old, d.new) for d in got.diff] == [
        ("spec.template.spec.containers[0].image", "nginx:1.25", "nginx:1.27")
    ]
    await rt.apply(request(edited, prior=recorded["Deployment"]), opts)
    assert (await change(rt, request(edited), opts)).action == "UnChanged"


async def test_secret_values_never_leave_the_diff(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str
) -> None:
    value = f"hunter2-{suffix()}"
    obj = secret(ns, "creds", {"password": value})
    created = await change(rt, request(obj), opts)
    assert created.action == "Create"
    await rt.apply(request(obj), opts)
    same = await change(rt, request(obj), opts)
    assert same.action == "UnChanged"
    rotated = secret(ns, "creds", {"password": value + "-rotated"})
    updated = await change(rt, request(rotated), opts)
    assert updated.action == "Update"
    assert [d.path for d in updated.diff] == ["data.password"]
    encoded = base64.b64encode(value.encode()).decode()
    for ch in (created, same, updated):
        text = ch.model_dump_json()
        assert value not in text and encoded not in text, text


async def test_a_field_the_spec_no_longer_sets_previews_as_removed_and_is_removed(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    """Server-side apply removes what stackflow set before and the spec no longer does (a
    data key, a label, a container's args, a Secret's key): the preview shows each removal
    (a Secret's value masked), the apply makes it, and what another manager set stays."""
    cm = config_map(ns, "settings", {"keep": "1", "drop": "2"})
    cm["metadata"]["labels"] = {"tier": "web", "old": "x"}
    web = deployment(ns, "web")
    web["spec"]["template"]["spec"]["containers"][0]["args"] = ["--verbose"]
    value = f"hunter2-{suffix()}"
    creds = secret(ns, "creds", {"user": "me", "password": value})
    recorded = [await rt.apply(request(obj), opts) for obj in (cm, web, creds)]
    core = k8s.CoreV1Api(api)
    core.patch_namespaced_config_map("settings", ns, {"data": {"theirs": "3"}})

    cm_next = config_map(ns, "settings", {"keep": "1"})
    cm_next["metadata"]["labels"] = {"tier": "web"}
    web_next = deployment(ns, "web")
    creds_next = secret(ns, "creds", {"user": "me"})
    removals = {
        "ConfigMap": [("data.drop", "2", None), ("metadata.labels.old", "x", None)],
        "Deployment": [("spec.template.spec.containers[0].args[0]", "--verbose", None)],
        "Secret": [("data.password", "(sensitive value)", None)],
    }
    for obj, prior in zip((cm_next, web_next, creds_next), recorded, strict=True):
        got = await change(rt, request(obj, prior=prior), opts, prior=prior)
        assert got.action == "Update" and not got.drift, got
        assert [(d.path, d.old, d.new) for d in got.diff] == removals[obj["kind"]]
        assert value not in got.model_dump_json()
        await rt.apply(request(obj, prior=prior), opts)
        assert (await change(rt, request(obj), opts)).action == "UnChanged"
    held = core.read_namespaced_config_map("settings", ns)
    assert held.data == {"keep": "1", "theirs": "3"} and "old" not in held.metadata.labels
    deployed = k8s.AppsV1Api(api).read_namespaced_deployment("web", ns)
    assert deployed.spec.template.spec.containers[0].args is None
    assert set(core.read_namespaced_secret("creds", ns).data or {}) == {"user"}


async def test_a_preview_of_an_object_another_manager_keeps_changing_shows_the_apply(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    ns: str,
    api: k8s.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another manager (a controller writing its status, say) changes the object after the
    preview read it, and again after its dry run: the preview reads it again and dry-runs
    onto what it read, so it still shows the field the spec stops setting going back to its
    default, and not the other manager's change (it once showed UnChanged here)."""
    recorded = await rt.apply(request(deployment(ns, "web", replicas=2)), opts)
    unset = deployment(ns, "web")
    del unset["spec"]["replicas"]
    req = request(unset, prior=recorded)
    live = await rt.read(req, opts)
    apps = k8s.AppsV1Api(api)
    reads = []
    real_get = rt.kube.get

    def other_manager_writes(n: int) -> None:
        body = {"metadata": {"annotations": {"other": str(n)}}}
        apps.patch_namespaced_deployment("web", ns, body, field_manager="other")

    def get(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs.get("fresh", False))
        if len(reads) == 2:
            other_manager_writes(2)  # after the dry run, before the fresh read
        found = real_get(*args, **kwargs)
        if len(reads) == 1:
            other_manager_writes(1)  # after the read, before the dry run
        return found

    monkeypatch.setattr(rt.kube, "get", get)
    result = await rt.preview(req, opts)
    got = diff_resource(
        req.id, req.type, result.would_be, live, recorded, removed_paths=result.removed_paths
    )
    # the read, then fresh reads only: one, and another when the server's dry run merged onto
    # its watch cache's object before that cache held the second change (a dry run is never
    # written, so nothing makes the server check it against storage); never past the bound
    assert reads[0] is False and reads[1:] and all(reads[1:]), reads
    assert len(reads) <= 1 + DRY_RUN_ATTEMPTS
    assert got.action == "Update" and not got.drift
    assert [(d.path, d.old, d.new) for d in got.diff] == [("spec.replicas", 2, 1)]


async def test_what_the_apply_changes_beyond_the_spec_previews_as_it_will_be(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    """A field the spec stops setting goes back to its default (replicas 2 -> 1), a field the
    server allocates appears (a NodePort's port): the preview shows them, as kubectl diff
    does; what another manager changed after the preview's listing is not shown as the
    apply's (the dry run's object is read again)."""
    from stackflow.runtimes.base import read_scope

    recorded = await rt.apply(request(deployment(ns, "web", replicas=2)), opts)
    unset = deployment(ns, "web")
    del unset["spec"]["replicas"]
    got = await change(rt, request(unset, prior=recorded), opts, prior=recorded)
    assert got.action == "Update" and not got.drift
    assert [(d.path, d.old, d.new) for d in got.diff] == [("spec.replicas", 2, 1)]
    await rt.apply(request(unset, prior=recorded), opts)
    assert k8s.AppsV1Api(api).read_namespaced_deployment("web", ns).spec.replicas == 1

    await rt.apply(request(service(ns, "web")), opts)
    node_port = service(ns, "web")
    node_port["spec"]["type"] = "NodePort"
    got = await change(rt, request(node_port), opts)
    assert ("spec.ports[0].nodePort", None) in [(d.path, d.old) for d in got.diff]
    assert ("spec.type", "ClusterIP", "NodePort") in [(d.path, d.old, d.new) for d in got.diff]

    maps = [config_map(ns, f"c{i}", {"k": str(i)}) for i in range(9)]
    for cm in maps:
        await rt.apply(request(cm), opts)
    core = k8s.CoreV1Api(api)
    with read_scope("stale-run", maps):
        await asyncio.gather(*(rt.read(request(cm), opts) for cm in maps))  # listed
        core.patch_namespaced_config_map("c0", ns, {"metadata": {"labels": {"team": "x"}}})
        edited = config_map(ns, "c0", {"k": "new"})
        live, preview = await rt.observe(request(edited), opts, with_preview=True)
    assert live is not None and live["metadata"]["labels"]["team"] == "x"  # read again
    assert "team" not in preview.would_be["metadata"].get("labels", {})
    assert preview.removed_paths == []


async def test_crd_and_custom_resource_in_one_run(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    group = f"g{suffix()}.stackflow.test"
    definition, item = crd(group), widget(group, ns, "w1", "blue")
    try:
        # before the CRD exists: the custom resource previews as its manifest
        assert (await change(rt, request(item), opts)).action == "Create"
        await rt.apply(request(definition), opts)
        # no wait for Established in between: apply finds the new kind by re-discovery
        live = await rt.apply(request(item), opts)
        assert live["spec"] == {"color": "blue", "size": 1}  # the schema default applied
        assert (await change(rt, request(item), opts)).action == "UnChanged"
        assert (await change(rt, request(definition), opts)).action == "UnChanged"
        ready = await rt.wait_ready(request(definition), opts)
        assert ready["metadata"]["name"] == f"widgets.{group}"
        # foreground deletion of a kind the garbage collector has not resynced yet would
        # wait up to 30 s for it; background deletion does not need the collector
        await rt.delete(request(item, deletionPropagation="Background"), opts)
        assert await rt.read(request(item), opts) is None
        await rt.delete(request(definition), opts)
        assert await rt.read(request(item), opts) is None  # the kind is gone too
        await rt.delete(request(item), opts)  # deleting what is gone succeeds
    finally:
        delete_quietly(api, crds=[definition["metadata"]["name"]])


async def test_crd_fields_added_since_1_30_are_kept_and_enforced(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    """selectableFields (GA in 1.32) and CEL validation rules with messageExpression, reason
    and fieldPath: a 1.30 server dropped selectableFields silently. Applied, they are read back
    as sent, preview afterwards is UnChanged, and the server enforces both."""
    group = f"g{suffix()}.stackflow.test"
    definition = crd(group)
    version = definition["spec"]["versions"][0]
    version["selectableFields"] = [{"jsonPath": ".spec.color"}]
    # a messageExpression's estimated cost must fit the budget: color gets a maxLength (1.37
    # refused "'... got ' + string(self.size)" as over it by more than 100x)
    rules = [
        {
            "rule": "!has(self.color) || self.color != 'red'",
            "messageExpression": "'color ' + self.color + ' is reserved'",
            "reason": "FieldValueForbidden",
            "fieldPath": ".color",
        }
    ]
    spec_props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_props["properties"]["color"]["maxLength"] = 32
    spec_props["x-kubernetes-validations"] = rules
    try:
        assert (await change(rt, request(definition), opts)).action == "Create"
        await rt.apply(request(definition), opts)
        live = await rt.read(request(definition), opts)
        assert live is not None
        [got] = live["spec"]["versions"]
        assert got["selectableFields"] == [{"jsonPath": ".spec.color"}]
        assert got["schema"]["openAPIV3Schema"]["properties"]["spec"] == spec_props
        assert got == version  # nothing dropped, nothing defaulted into the version
        assert (await change(rt, request(definition), opts)).action == "UnChanged"
        await rt.wait_ready(request(definition), opts)

        with pytest.raises(InvalidInput, match="color red is reserved"):
            await rt.apply(request(widget(group, ns, "w0", "red")), opts)
        for name, color in (("w1", "blue"), ("w2", "green")):
            await rt.apply(request(widget(group, ns, name, color)), opts)
        listed = k8s.CustomObjectsApi(api).list_namespaced_custom_object(
            group, "v1", ns, "widgets", field_selector="spec.color=green"
        )
        assert [item["metadata"]["name"] for item in listed["items"]] == ["w2"]
        assert (await change(rt, request(widget(group, ns, "w1", "blue")), opts)).action == (
            "UnChanged"
        )
    finally:
        delete_quietly(api, crds=[definition["metadata"]["name"]])


async def test_invalid_manifests_fail_at_preview_with_the_servers_message(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str
) -> None:
    bad = deployment(ns, "bad")
    bad["spec"]["selector"]["matchLabels"] = {"app": "other"}
    with pytest.raises(InvalidInput, match=r"selector.*does not match template"):
        await rt.preview(request(bad), opts)
    bad_name = config_map(ns, "Not_A_Name", {})
    with pytest.raises(InvalidInput, match="RFC 1123"):
        await rt.preview(request(bad_name), opts)
    wrong_id = request(config_map(ns, "a", {})).model_copy(update={"id": f"v1:ConfigMap:{ns}:b"})
    with pytest.raises(InvalidInput, match="does not match the manifest"):
        await rt.preview(wrong_id, opts)
    cluster_scoped = namespace(f"x{suffix()}")
    cluster_scoped["metadata"]["namespace"] = ns
    with pytest.raises(InvalidInput, match="cluster-scoped"):
        await rt.preview(request(cluster_scoped), opts)


async def test_create_in_a_namespace_made_earlier_in_the_run_previews_as_manifest(
    rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient
) -> None:
    missing = f"sf-{suffix()}"
    obj = config_map(missing, "later", {"k": "v"})
    result = await rt.preview(request(obj), opts)
    assert result.would_be["data"] == {"k": "v"}
    assert result.would_be["metadata"]["annotations"]["stackflow.io/workspace"] == "dev"
    assert await rt.read(request(obj), opts) is None
    with pytest.raises(Exception, match="does its namespace exist"):
        await rt.apply(request(obj), opts)


async def test_drift_is_detected_and_repaired_but_new_contested_fields_conflict(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    obj = deployment(ns, "web", replicas=1)
    recorded = await rt.apply(request(obj), opts)
    apps = k8s.AppsV1Api(api)
    # someone scales it behind stackflow's back, as another field manager
    apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 3}}, field_manager="intruder")
    got = await change(rt, request(obj, prior=recorded), opts, prior=recorded)
    assert got.action == "Update" and got.drift
    assert [(d.path, d.old, d.new) for d in got.diff] == [("spec.replicas", 3, 1)]
    repaired = await rt.apply(request(obj, prior=recorded), opts)
    assert repaired["spec"]["replicas"] == 1
    assert apps.read_namespaced_deployment("web", ns).spec.replicas == 1

    # a label another manager set, which the spec now starts to set differently: a conflict
    apps.patch_namespaced_deployment(
        "web", ns, {"metadata": {"labels": {"team": "blue"}}}, field_manager="intruder"
    )
    contested = deployment(ns, "web", replicas=1)
    contested["metadata"]["labels"] = {"team": "red"}
    with pytest.raises(Conflict, match=r"intruder.*|.*\.metadata\.labels\.team") as err:
        await rt.apply(request(contested, prior=repaired), opts)
    assert "intruder" in str(err.value) and ".metadata.labels.team" in str(err.value)
    with pytest.raises(Conflict, match="intruder"):
        await rt.preview(request(contested, prior=repaired), opts)
    # unless forced
    forced = await rt.apply(request(contested, prior=repaired, force=True), opts)
    assert forced["metadata"]["labels"]["team"] == "red"


async def test_ownership_conflicts_and_adoption(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    other = RuntimeOptions(project=f"q{suffix()}", workspace="prod")
    owned = config_map(ns, "theirs", {"a": "1"})
    await rt.apply(request(owned), other)
    with pytest.raises(Conflict, match=f"belongs to stackflow stack {other.project}/prod"):
        await rt.apply(request(owned), opts)
    with pytest.raises(Conflict, match=f"{other.project}/prod"):
        await rt.preview(request(owned), opts)
    with pytest.raises(Conflict, match="refusing to delete"):
        await rt.delete(request(owned), opts)
    assert await rt.read(request(owned), opts) is not None

    core = k8s.CoreV1Api(api)
    core.create_namespaced_config_map(
        ns,
        k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="handmade"), data={"a": "1"}),
        field_manager="kubectl",
    )
    unowned = config_map(ns, "handmade", {"a": "1"})
    with pytest.raises(Conflict, match=r"not managed by stackflow.*adopt"):
        await rt.apply(request(unowned), opts)
    adopted = await rt.apply(request(unowned, adopt=True), opts)
    assert adopted["metadata"]["annotations"]["stackflow.io/project"] == opts.project
    assert (await change(rt, request(unowned), opts)).action == "UnChanged"  # ours now


async def test_new_objects_in_a_namespace_the_run_created_are_applied_without_a_read(
    rt: KubernetesRuntime, api: k8s.ApiClient, sent: list[Sent]
) -> None:
    """A run that created a namespace applies the new objects in it without the ownership
    read (nothing could be there before the namespace); an object that appeared meanwhile
    (the apply answered 200, not 201) has the fields stackflow set withdrawn and fails as
    Conflict, as the read would have. A second apply of the same object in the run, another
    run, and the objects the control plane makes in every namespace are read first."""
    run = RunRef(workflow_id=f"apply-{suffix()}", run_id="first")
    opts = RuntimeOptions(project=f"p{suffix()}", workspace="dev", timeout_seconds=60, owner=run)
    other_run = opts.model_copy(update={"owner": RunRef(workflow_id=run.workflow_id, run_id="2")})
    core = k8s.CoreV1Api(api)
    name = f"sf-{suffix()}"
    try:
        await rt.apply(request(namespace(name)), opts)
        sent.clear()
        made = await rt.apply(request(config_map(name, "a", {"k": "1"})), opts)
        assert [s.method for s in sent] == ["PATCH"]
        assert made["metadata"]["annotations"]["stackflow.io/project"] == opts.project
        sent.clear()  # the same object again in this run (a retried attempt): read first
        await rt.apply(request(config_map(name, "a", {"k": "2"})), opts)
        assert [s.method for s in sent] == ["GET", "PATCH"]
        sent.clear()
        await rt.apply(request(config_map(name, "b", {"k": "1"})), other_run)
        assert [s.method for s in sent] == ["GET", "PATCH"]
        sent.clear()  # a forced apply takes fields over: it is never withdrawn, so read first
        await rt.apply(request(config_map(name, "d", {"k": "1"}), force=True), opts)
        assert [s.method for s in sent] == ["GET", "PATCH"]

        core.create_namespaced_config_map(
            name,
            k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c"), data={"k": "theirs"}),
            field_manager="kubectl",
        )
        sent.clear()
        with pytest.raises(Conflict, match=f"appeared in namespace {name}, which this run created"):
            await rt.apply(request(config_map(name, "c", {"k": "theirs", "x": "ours"})), opts)
        assert [s.method for s in sent] == ["PATCH", "PATCH"]  # the apply, the withdrawal
        live = core.read_namespaced_config_map("c", name)
        assert live.data == {"k": "theirs"}
        assert "stackflow.io/project" not in (live.metadata.annotations or {})
        assert [m.manager for m in live.metadata.managed_fields] == ["kubectl"]
        with pytest.raises(Conflict, match="not managed by stackflow"):  # as for any other
            await rt.apply(request(config_map(name, "c", {"k": "theirs"})), opts)

        deadline = time.monotonic() + 30  # the service account controller makes "default"
        while not core.list_namespaced_service_account(name).items:
            assert time.monotonic() < deadline, "no default ServiceAccount"
            await asyncio.sleep(0.1)
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": name},
        }
        sent.clear()
        with pytest.raises(Conflict, match="not managed by stackflow"):
            await rt.apply(request(account), opts)
        assert [s.method for s in sent] == ["GET"]
    finally:
        delete_quietly(api, namespaces=[name])


async def test_readiness_rollout_job_and_timeout(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    dep, once = deployment(ns, "web", replicas=2), job(ns, "once")
    await rt.apply(request(dep), opts)
    await rt.apply(request(once), opts)
    await rt.wait_ready(request(dep), opts)
    status = k8s.AppsV1Api(api).read_namespaced_deployment_status("web", ns).status
    assert status is not None
    assert status.available_replicas == 2 and status.updated_replicas == 2
    pods = k8s.CoreV1Api(api).list_namespaced_pod(ns, label_selector="app=web").items
    assert {p.spec.node_name for p in pods if p.spec} == {"kwok-node-0"}  # faked by kwok
    assert [p.status.phase for p in pods if p.status] == ["Running", "Running"]
    await rt.wait_ready(request(once), opts)
    done = k8s.BatchV1Api(api).read_namespaced_job_status("once", ns).status
    assert done is not None and done.succeeded == 1

    # a new rollout that can never schedule: not ready within the resource's timeout
    stuck = deployment(ns, "stuck")
    stuck["spec"]["template"]["spec"]["nodeSelector"] = {"no-such": "node"}
    await rt.apply(request(stuck), opts)
    started = time.monotonic()
    with pytest.raises(
        NotReady, match=r"not ready after 1\.5s: (0 of 1 replicas updated|.*available)"
    ):
        await rt.wait_ready(request(stuck, readinessTimeout="1.5s"), opts)
    assert time.monotonic() - started < 5

    started = time.monotonic()
    await rt.delete(request(dep), opts)  # foreground: returns once pods and replicasets are gone
    assert time.monotonic() - started < 30
    assert k8s.CoreV1Api(api).list_namespaced_pod(ns, label_selector="app=web").items == []


async def test_unreachable_cluster_is_retryable(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    tmp_path: Path,
    kubeconfig: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STACKFLOW_ALLOWED_KUBECONFIGS", str(tmp_path))  # the worker policy
    text = Path(kubeconfig).read_text()
    port = json.dumps(text).split("127.0.0.1:")[1].split("\\n")[0]
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(text.replace(f"127.0.0.1:{port}", "127.0.0.1:1"))
    obj = config_map("default", "x", {})
    with pytest.raises(Unavailable, match="unreachable"):
        await rt.read(request(obj, kubeConfig=str(dead)), opts)
    with pytest.raises(InvalidInput, match="does not exist"):
        await rt.read(request(obj, kubeConfig=str(tmp_path / "none")), opts)
    with pytest.raises(InvalidInput, match="context"):
        await rt.read(request(obj, kubeContext="no-such-context"), opts)


async def test_non_ascii_reaches_the_api_server_intact(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str, api: k8s.ApiClient
) -> None:
    # an invalid name: the server's own naming rule, not a garbled request body
    for name in ("café-menü", "cake-\U0001f370"):
        with pytest.raises(InvalidInput) as err:
            await rt.apply(request(config_map(ns, name, {})), opts)
        message = str(err.value)
        assert "RFC 1123" in message and f'"{name}"' in message, message
        assert "invalid Unicode" not in message and "error decoding YAML" not in message
        assert "invalid metadata.name" in message and "\n" not in message
    # valid non-ASCII values round-trip, astral characters and line separators included
    data = {"menu": "crème brûlée", "cake": "\U0001f370 gâteau", "odd": "a\u2028b\x85c\x7f"}
    obj = config_map(ns, "menu", data)
    obj["metadata"]["annotations"] = {"example.com/chef": "Zoë Ångström"}
    live = await rt.apply(request(obj), opts)
    assert live["data"] == data
    stored = k8s.CoreV1Api(api).read_namespaced_config_map("menu", ns)
    assert stored.data == data and stored.metadata is not None
    assert (stored.metadata.annotations or {}).get("example.com/chef") == "Zoë Ångström"
    assert (await change(rt, request(obj), opts)).action == "UnChanged"


async def test_wrongly_typed_field_is_invalid_input_at_once(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str
) -> None:
    # server-side apply answers 500 "failed to create typed patch object": no retry helps
    bad = deployment(ns, "web")
    bad["spec"]["replicas"] = "1"
    expected = (
        f"apps/v1:Deployment:{ns}:web: .spec.replicas: expected numeric (int or float), got string"
    )
    for step in (rt.preview, rt.apply):
        started = time.monotonic()
        with pytest.raises(InvalidInput) as err:
            await step(request(bad), opts)
        assert str(err.value) == expected
        assert not err.value.retryable
        assert time.monotonic() - started < 3
    unknown = deployment(ns, "web")
    unknown["spec"]["replica"] = 1
    with pytest.raises(InvalidInput, match=r"\.spec\.replica: field not declared in schema"):
        await rt.apply(request(unknown), opts)


async def test_kinds_nothing_serves_fail_at_once_naming_kind_and_api_version(
    rt: KubernetesRuntime, opts: RuntimeOptions, ns: str
) -> None:
    group = f"g{suffix()}.stackflow.test"
    cases = [
        (f"{group}/v1", "Gadget", f"the API group '{group}' is not served and no "
         "CustomResourceDefinition defines kind Gadget"),
        ("apps/v2", "Deployment", "group apps serves v1, not v2"),
        ("v1", "ConfigMapp", "v1 has no kind ConfigMapp"),
        ("apps/v1", "deployment", "did you mean Deployment?"),
    ]  # fmt: skip
    for api_version, kind, why in cases:
        obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x", "namespace": ns}}
        started = time.monotonic()
        with pytest.raises(InvalidInput) as err:
            await rt.apply(request(obj), opts)
        assert time.monotonic() - started < 3  # no waiting for a CRD that does not exist
        message = str(err.value)
        assert message.startswith(
            f"{api_version}:{kind}:{ns}:x: the API server does not serve kind {kind} in "
            f"apiVersion {api_version}: "
        ), message
        assert why in message
    # a built-in group cannot gain kinds: preview says so too (a custom one may: its CRD
    # may come earlier in the same run, so it previews as the manifest)
    typo = {"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "x", "namespace": ns}}
    with pytest.raises(InvalidInput, match="v1 has no kind ConfigMapp"):
        await rt.preview(request(typo), opts)
    custom = {
        "apiVersion": f"{group}/v1",
        "kind": "Gadget",
        "metadata": {"name": "x", "namespace": ns},
    }
    assert (await rt.preview(request(custom), opts)).would_be["kind"] == "Gadget"


async def test_unreachable_server_is_unavailable_naming_it(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    tmp_path: Path,
    kubeconfig: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STACKFLOW_ALLOWED_KUBECONFIGS", str(tmp_path))  # the worker policy
    text = Path(kubeconfig).read_text()
    port = json.dumps(text).split("127.0.0.1:")[1].split("\\n")[0]
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(text.replace(f"127.0.0.1:{port}", "127.0.0.1:1"))
    obj = config_map("default", "x", {})
    for step in (rt.read, rt.preview, rt.apply, rt.delete):
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            await step(request(obj, kubeConfig=str(dead)), opts)
        message = str(err.value)
        assert message.startswith("v1:ConfigMap:default:x: Kubernetes API https://127.0.0.1:1 ")
        assert "unreachable" in message and "refused" in message and "\n" not in message
        assert err.value.retryable and time.monotonic() - started < 10


async def test_objects_of_a_namespace_yet_to_be_created_preview_without_requests(
    rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient, sent: list[Sent]
) -> None:
    """The first dry run finds the namespace missing; the next objects there are previewed as
    they are desired, with no request (nothing can exist in it); once the stack applies the
    Namespace, previews dry-run again."""
    name = f"sf-{suffix()}"
    maps = [request(config_map(name, f"c{i}", {"k": str(i)})) for i in range(3)]
    try:
        first = await rt.observe(maps[0], opts, with_preview=True)
        assert first[0] is None and first[1] is not None and "PATCH" in [s.method for s in sent]
        sent.clear()
        for cm in maps[1:]:
            live, result = await rt.observe(cm, opts, with_preview=True)
            assert (
                live is None
                and result is not None
                and result.would_be["data"] == cm.attributes["data"]
            )
        assert sent == []
        await rt.apply(request(namespace(name)), opts)
        sent.clear()
        await rt.observe(maps[1], opts, with_preview=True)
        # the dry run again, now that the namespace exists
        assert [s.method for s in sent].count("PATCH") == 1
    finally:
        delete_quietly(api, namespaces=[name])


async def test_a_preview_batch_reads_many_objects_of_a_kind_from_one_listing(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    ns: str,
    sent: list[Sent],
) -> None:
    """Ten ConfigMaps of one namespace in a preview batch: one LIST answers their reads, the
    run's next batch reuses it, another run lists anew, and
    what each read returns is what a GET returns."""
    from stackflow.runtimes.base import read_scope
    from stackflow.runtimes.kubernetes.snapshot import LIST_AT_LEAST

    maps = [request(config_map(ns, f"c{i}", {"k": str(i)})) for i in range(10)]
    for cm in maps[:9]:  # the last one does not exist
        await rt.apply(cm, opts)
    alone = [await rt.read(cm, opts) for cm in maps]
    sent.clear()
    listing = f"/api/v1/namespaces/{ns}/configmaps"

    async def batch(run: str, reqs: list[ResourceRequest]) -> list[Any]:
        with read_scope(run, [r.attributes for r in reqs]):
            return list(
                await asyncio.gather(*(rt.observe(r, opts, with_preview=True) for r in reqs))
            )

    seen = await batch("run-1", maps)
    assert [live for live, _ in seen] == alone and alone[-1] is None
    gets = [p for m, p, _ in sent if m == "GET"]
    assert gets == [listing]  # one LIST, no GET per object
    # the nine applied and unchanged need no dry run (see the next test); the new one does
    assert [p for m, p, _ in sent if m == "PATCH"] == [f"{listing}/c9"]

    sent.clear()
    await batch("run-1", maps)  # the run's next preview batch: the same snapshot
    assert [p for m, p, _ in sent if m == "GET"] == []
    sent.clear()
    await batch("run-2", maps)
    assert [p for m, p, _ in sent if m == "GET"] == [listing]
    sent.clear()
    few = maps[: LIST_AT_LEAST - 1]  # too few of the kind to list: a GET each
    await batch("run-3", few)
    assert sorted(p for m, p, _ in sent if m == "GET") == sorted(
        f"{listing}/{cm.attributes['metadata']['name']}" for cm in few
    )
    # Secrets are never listed (a listing would hold every Secret of the namespace)
    secrets = [request(secret(ns, f"s{i}", {"k": str(i)})) for i in range(10)]
    sent.clear()
    await batch("run-4", secrets)
    gets = [p for m, p, _ in sent if m == "GET"]
    assert len(gets) == 10 and f"/api/v1/namespaces/{ns}/secrets" not in gets


async def test_deletes_after_a_listed_preview_need_no_read_unless_the_object_changed(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    ns: str,
    api: k8s.ApiClient,
    sent: list[Sent],
) -> None:
    """A destroy whose preview listed the objects deletes each on the condition that it is
    still exactly what the preview read (uid and resourceVersion), with no GET; an object
    changed, gone or replaced since is read again and handled as before."""
    from stackflow.runtimes.base import Conflict, read_scope
    from stackflow.runtimes.kubernetes.manifest import ANNOTATION_PROJECT, ANNOTATION_WORKSPACE

    maps = [request(config_map(ns, f"d{i}", {"k": str(i)})) for i in range(9)]
    for cm in maps:
        await rt.apply(cm, opts)
    with read_scope("destroy-run", [cm.attributes for cm in maps]):
        await asyncio.gather(*(rt.read(cm, opts) for cm in maps))  # the preview: one LIST
    core = k8s.CoreV1Api(api)
    core.patch_namespaced_config_map("d6", ns, {"data": {"k": "changed"}})  # changed since
    core.delete_namespaced_config_map("d7", ns)  # gone since
    core.delete_namespaced_config_map("d8", ns)  # replaced by another stack's object
    core.create_namespaced_config_map(
        ns,
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(
                name="d8", annotations={ANNOTATION_PROJECT: "other", ANNOTATION_WORKSPACE: "dev"}
            ),
            data={"k": "theirs"},
        ),
    )
    sent.clear()
    with read_scope("destroy-run", lists=False):  # the walk of the same run
        done = await asyncio.gather(*(rt.delete(cm, opts) for cm in maps), return_exceptions=True)
    assert done[:8] == [None] * 8
    assert isinstance(done[8], Conflict) and "belongs to stackflow stack other/dev" in str(done[8])
    assert sorted(s.name for s in sent if s.method == "GET") == ["d6", "d8"]
    assert sorted(s.name for s in sent if s.method == "DELETE") == [
        *(f"d{i}" for i in range(6)),
        "d6",  # refused (changed), then sent again after reading it
        "d6",
        "d7",
        "d8",
    ]
    left = [
        str((cm.metadata and cm.metadata.name) or "")
        for cm in core.list_namespaced_config_map(ns).items
    ]
    assert sorted(n for n in left if n.startswith("d")) == ["d8"]


async def test_a_namespace_of_many_other_objects_is_not_listed(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    ns: str,
    api: k8s.ApiClient,
    sent: list[Sent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pages of 5, at most twice the wanted objects: the stack's 10 ConfigMaps alone are
    listed page by page; beside 25 others, the listing is given up after its first page (the
    server counts what remains) and each object is read alone."""
    from stackflow.runtimes.base import read_scope
    from stackflow.runtimes.kubernetes import snapshot

    monkeypatch.setattr(snapshot, "LIST_PAGE", 5)
    monkeypatch.setattr(snapshot, "LIST_SPARE", 2)
    maps = [request(config_map(ns, f"c{i}", {"k": str(i)})) for i in range(10)]
    for cm in maps:
        await rt.apply(cm, opts)
    sent.clear()

    async def preview(run: str, run_size: int = 0) -> list[Any]:
        with read_scope(run, [cm.attributes for cm in maps], run_size=run_size):
            return list(await asyncio.gather(*(rt.read(cm, opts) for cm in maps)))

    first = await preview("few")
    assert all(live is not None for live in first)
    # the namespace's own kube-root-ca.crt is listed too: 11 objects, three pages of 5
    assert [(s.method, s.name, s.limit) for s in sent] == [("GET", "configmaps", "5")] * 3
    core = k8s.CoreV1Api(api)
    for i in range(25):
        core.create_namespaced_config_map(
            ns, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"other-{i}"), data={"i": "x"})
        )
    sent.clear()
    again = await preview("many")
    assert again == first
    gets = [(s.name, s.limit) for s in sent if s.method == "GET"]
    assert gets[0] == ("configmaps", "5") and sorted(name for name, _ in gets[1:]) == sorted(
        cm.attributes["metadata"]["name"] for cm in maps
    )
    # a run whose preview reads 20 of them in all (this batch's 10, others in later batches)
    # weighs the 36 against those 20: listed, once, for all its batches
    sent.clear()
    assert await preview("run-wide", run_size=20) == first
    assert [(s.method, s.name, s.limit) for s in sent] == [("GET", "configmaps", "5")] * 8


async def test_a_preview_skips_the_dry_run_only_where_it_would_answer_the_live_object(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    ns: str,
    api: k8s.ApiClient,
    sent: list[Sent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object the apply would leave as it is previews from the live object alone (no dry
    run); each preview equals the dry run's, whether it skipped it or not: after another
    manager's edits, with a field dropped from the spec, with lists, an empty map, a Secret,
    a Deployment and a Service (lists by key, atomic selectors), the Namespace itself."""
    from stackflow.runtimes.kubernetes import runtime as runtime_module

    core = k8s.CoreV1Api(api)
    cm = config_map(ns, "plain", {"a": "1", "b": "2"})
    empty = config_map(ns, "empty", {})
    secret_obj = secret(ns, "creds", {"password": "hunter2"})
    web = deployment(ns, "web")
    svc = service(ns, "web")
    objs = (cm, empty, secret_obj, web, svc)
    recorded = [await rt.apply(request(obj), opts) for obj in objs]

    async def both(obj: Obj, prior: Obj | None = None) -> tuple[bool, Any]:
        """(whether the preview sent a dry run, its answer), checked against the dry run's."""
        sent.clear()
        got = await rt.observe(request(obj, prior=prior), opts, with_preview=True)
        dry_run = any(s.method == "PATCH" for s in sent)
        with monkeypatch.context() as m:
            m.setattr(runtime_module, "applies_unchanged", lambda desired, live: False)
            assert await rt.observe(request(obj, prior=prior), opts, with_preview=True) == got
        return dry_run, got

    # lists of items by key (a port's protocol defaulted), atomic maps (selectors)
    for obj in (cm, secret_obj, namespace(ns), web, svc):
        assert (await both(obj))[0] is False, obj["kind"]
    assert (await both(deployment(ns, "web", image="nginx:1.27")))[0] is True
    assert (await both(deployment(ns, "web", replicas=2)))[0] is True
    assert (await both(config_map(ns, "plain", {"a": "1"})))[0] is True  # "b" would go
    assert (await both(config_map(ns, "plain", {"a": "1", "b": "2", "c": "3"})))[0] is True
    assert (await both(config_map(ns, "plain", {"a": "9", "b": "2"})))[0] is True
    dry_run, (live, _) = await both(empty)
    assert dry_run is True and "data" not in live  # the server keeps no empty map

    # another manager adds a label: stackflow's fields are as they were, no dry run
    core.patch_namespaced_config_map("plain", ns, {"metadata": {"labels": {"team": "x"}}})
    dry_run, (live, preview) = await both(cm)
    assert dry_run is False and live["metadata"]["labels"]["team"] == "x"
    assert preview.would_be["data"] == {"a": "1", "b": "2"}
    apps = k8s.AppsV1Api(api)  # the controller scales it: a field stackflow set
    apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 3}})
    assert (await both(web, prior=recorded[3]))[0] is True
    # another manager changes a value stackflow set: the dry run decides (drift repair)
    core.patch_namespaced_config_map("plain", ns, {"data": {"a": "drifted"}})
    dry_run, (live, preview) = await both(cm, prior=recorded[0])
    assert dry_run is True and live["data"]["a"] == "drifted"
    assert preview.would_be["data"] == {"a": "1", "b": "2"}
