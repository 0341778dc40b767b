"""The Kubernetes runtime's delete returns once the object is gone, and not before, for many
deletions at once in one namespace and for a user who may not list or watch.

Objects are held by a finalizer of the test's own, so "not before" is certain: while the
finalizer is there, the object exists and its deletion must still be waiting.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from stackflow.runtimes.base import RuntimeOptions, read_scope
from stackflow.runtimes.kubernetes import KubernetesRuntime
from tests.integration.kubehelp import (
    api_client,
    config_map,
    crd,
    delete_quietly,
    deployment,
    kusion_id,
    namespace,
    request,
    suffix,
    wait_for,
    widget,
)

HOLD = "stackflow.io/test-hold"
WAIT = 60.0


@pytest.fixture
def opts() -> RuntimeOptions:
    return RuntimeOptions(project=f"p{suffix()}", workspace="dev", timeout_seconds=120)


@pytest.fixture
async def ns(rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient) -> AsyncIterator[str]:
    name = f"sf-del-{suffix()}"
    await rt.apply(request(namespace(name)), opts)
    yield name
    core = k8s.CoreV1Api(api)
    for cm in core.list_namespaced_config_map(name).items:  # release anything still held
        if cm.metadata and cm.metadata.name and cm.metadata.finalizers:
            core.patch_namespaced_config_map(
                cm.metadata.name, name, {"metadata": {"finalizers": None}}
            )
    delete_quietly(api, namespaces=[name])


def _exists(api: k8s.ApiClient, ns: str, name: str) -> Any:
    try:
        return k8s.CoreV1Api(api).read_namespaced_config_map(name, ns)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _hold(api: k8s.ApiClient, ns: str, name: str) -> None:
    k8s.CoreV1Api(api).patch_namespaced_config_map(name, ns, {"metadata": {"finalizers": [HOLD]}})


def _release(api: k8s.ApiClient, ns: str, name: str) -> None:
    k8s.CoreV1Api(api).patch_namespaced_config_map(name, ns, {"metadata": {"finalizers": None}})


def _deleting(api: k8s.ApiClient, ns: str, name: str) -> bool:
    live = _exists(api, ns, name)
    return bool(live is not None and live.metadata.deletion_timestamp)


async def _deletes_wait_for_the_finalizer(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    api: k8s.ApiClient,
    ns: str,
    extensions: dict[str, Any],
) -> None:
    free = [config_map(ns, f"free-{i}", {"i": str(i)}) for i in range(6)]
    held = [config_map(ns, f"held-{i}", {"i": str(i)}) for i in range(3)]
    for obj in free + held:
        await rt.apply(request(obj, **extensions), opts)
    for obj in held:
        _hold(api, ns, obj["metadata"]["name"])

    tasks = {
        obj["metadata"]["name"]: asyncio.create_task(rt.delete(request(obj, **extensions), opts))
        for obj in free + held
    }
    # the free ones go (foreground: the garbage collector lifts its finalizer) and say so
    await asyncio.wait_for(
        asyncio.gather(*(tasks[o["metadata"]["name"]] for o in free)), timeout=WAIT
    )
    for obj in free:
        assert _exists(api, ns, obj["metadata"]["name"]) is None
    # the held ones: deletion started, the object is still there, so the delete still waits
    for obj in held:
        name = obj["metadata"]["name"]
        await asyncio.to_thread(
            wait_for, lambda n=name: _deleting(api, ns, n), timeout=WAIT, what=f"{name} deleting"
        )
    await asyncio.sleep(0.5)  # let any wrongly early return happen
    for obj in held:
        name = obj["metadata"]["name"]
        assert _exists(api, ns, name) is not None
        assert not tasks[name].done(), f"delete of {name} returned while the object exists"
    # released one at a time: each delete returns, with its object gone
    for obj in held:
        name = obj["metadata"]["name"]
        _release(api, ns, name)
        await asyncio.wait_for(tasks[name], timeout=WAIT)
        assert _exists(api, ns, name) is None
    for task in tasks.values():
        assert task.done() and task.exception() is None


async def test_deletes_in_one_namespace_return_once_each_object_is_gone(
    rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient, ns: str
) -> None:
    await _deletes_wait_for_the_finalizer(rt, opts, api, ns, {"deletionPropagation": "Foreground"})
    # Background propagation too (no garbage-collector finalizer: gone at once when free)
    await _deletes_wait_for_the_finalizer(rt, opts, api, ns, {"deletionPropagation": "Background"})


async def test_a_custom_resource_of_a_new_crd_is_deleted_in_the_background_and_waited_for(
    rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient, ns: str
) -> None:
    """The garbage collector learns a new CRD's kind only at its next discovery resync (30 s):
    a foreground deletion (its ``foregroundDeletion`` finalizer) would wait for that. The
    custom resource goes in the background, as kubectl deletes it, and its delete still
    returns only once it is gone."""
    group = f"g{suffix()}.stackflow.test"
    definition = crd(group)
    custom = k8s.CustomObjectsApi(api)
    try:
        await rt.apply(request(definition), opts)
        item = widget(group, ns, "held", "blue")
        await rt.apply(request(item), opts)
        where = (group, "v1", ns, "widgets", "held")
        custom.patch_namespaced_custom_object(*where, {"metadata": {"finalizers": [HOLD]}})
        task = asyncio.create_task(rt.delete(request(item), opts))

        def deleting() -> Any:
            live = custom.get_namespaced_custom_object(*where)
            return live if live["metadata"].get("deletionTimestamp") else None

        live = await asyncio.to_thread(wait_for, deleting, timeout=WAIT, what="held deleting")
        assert live["metadata"]["finalizers"] == [HOLD]  # no foregroundDeletion
        await asyncio.sleep(0.5)  # let any wrongly early return happen
        assert not task.done(), "the delete returned while the custom resource exists"
        custom.patch_namespaced_custom_object(*where, {"metadata": {"finalizers": None}})
        await asyncio.wait_for(task, timeout=WAIT)
        assert await rt.read(request(item), opts) is None
    finally:
        delete_quietly(api, crds=[definition["metadata"]["name"]])


async def test_an_object_whose_namespace_the_run_deletes_goes_without_a_foreground_wait(
    rt: KubernetesRuntime, opts: RuntimeOptions, api: k8s.ApiClient, ns: str
) -> None:
    """A Deployment goes dependents first (its delete waits for its ReplicaSet), unless the
    run's preview on this worker previewed the deletion of its Namespace: the run deletes
    that after it and waits until it is gone, with all it held."""
    apps = k8s.AppsV1Api(api)

    def held_replica_set(name: str) -> str:
        """The Deployment's ReplicaSet, held by the test's finalizer."""

        def made() -> Any:
            found = apps.list_namespaced_replica_set(ns).items
            return next((r for r in found if r.metadata.name.startswith(f"{name}-")), None)

        rs = wait_for(made, timeout=WAIT, what=f"{name}'s ReplicaSet").metadata.name
        apps.patch_namespaced_replica_set(rs, ns, {"metadata": {"finalizers": [HOLD]}})
        return str(rs)

    async def delete(name: str, run: str) -> tuple[bool, list[str]]:
        """Delete the Deployment ``name`` in ``run``'s walk while its ReplicaSet is held:
        whether the delete returned meanwhile, and the Deployment's finalizers then."""
        item = deployment(ns, name, replicas=0)
        await rt.apply(request(item), opts)
        rs = await asyncio.to_thread(held_replica_set, name)
        with read_scope(run, lists=False):
            task = asyncio.create_task(rt.delete(request(item), opts))
        await asyncio.sleep(3.0)  # the garbage collector's round, and any early return
        returned = task.done()
        try:
            live = apps.read_namespaced_deployment(name, ns)
            finalizers = list(live.metadata.finalizers or [])
        except k8s.ApiException as exc:
            assert exc.status == 404
            finalizers = []
        apps.patch_namespaced_replica_set(rs, ns, {"metadata": {"finalizers": None}})
        await asyncio.wait_for(task, timeout=WAIT)
        with pytest.raises(k8s.ApiException):
            apps.read_namespaced_deployment(name, ns)
        return returned, finalizers

    space = namespace(ns)
    # a run whose preview read the namespace for its deletion
    with read_scope("run-deleting-it", [space], deleting=[kusion_id(space)]):
        assert await rt.read(request(space), opts) is not None
    assert await delete("kept-apart", "run-keeping-it") == (False, ["foregroundDeletion"])
    assert await delete("goes-with-it", "run-deleting-it") == (True, [])


async def test_delete_needs_no_list_or_watch_permission(
    rt: KubernetesRuntime,
    opts: RuntimeOptions,
    api: k8s.ApiClient,
    ns: str,
    kubeconfig: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a service account that may get, apply and delete config maps, but not list or watch them
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    meta = k8s.V1ObjectMeta(name="no-watch")
    core.create_namespaced_service_account(ns, k8s.V1ServiceAccount(metadata=meta))
    rule = k8s.V1PolicyRule(
        api_groups=[""], resources=["configmaps"], verbs=["get", "create", "patch", "delete"]
    )
    rbac.create_namespaced_role(ns, k8s.V1Role(metadata=meta, rules=[rule]))
    rbac.create_namespaced_role_binding(
        ns,
        k8s.V1RoleBinding(
            metadata=meta,
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="no-watch"
            ),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name="no-watch", namespace=ns)],
        ),
    )
    issued = core.create_namespaced_service_account_token(
        "no-watch",
        ns,
        k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    assert issued.status is not None
    token = issued.status.token
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    limited = tmp_path / "no-watch-kubeconfig"
    limited.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "dev", "cluster": cluster}],
                "users": [{"name": "no-watch", "user": {"token": token}}],
                "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "no-watch"}}],
                "current-context": "dev",
            }
        )
    )
    assert base64.b64decode(cluster["certificate-authority-data"])  # the same trusted CA
    monkeypatch.setenv("STACKFLOW_ALLOWED_KUBECONFIGS", str(tmp_path))  # the worker policy
    with pytest.raises(k8s.ApiException) as refused:  # the premise: this user may not list
        limited_client = api_client(str(limited))
        try:
            k8s.CoreV1Api(limited_client).list_namespaced_config_map(ns, watch=False)
        finally:
            limited_client.close()  # type: ignore[no-untyped-call]
    assert refused.value.status == 403
    await _deletes_wait_for_the_finalizer(rt, opts, api, ns, {"kubeConfig": str(limited)})

    # a preview batch of many objects of the kind: the listing is refused, each is read alone
    from stackflow.runtimes.base import read_scope

    maps = [
        request(config_map(ns, f"seen-{i}", {"i": str(i)}), kubeConfig=str(limited))
        for i in range(10)
    ]
    for cm in maps[:5]:
        await rt.apply(cm, opts)
    with read_scope("limited-run", [cm.attributes for cm in maps]):
        seen = await asyncio.gather(*(rt.observe(cm, opts, with_preview=True) for cm in maps))
    assert [live is not None for live, _ in seen] == [True] * 5 + [False] * 5
    assert all(result is not None for _, result in seen)
