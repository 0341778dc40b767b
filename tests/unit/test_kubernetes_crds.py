"""CustomResourceDefinitions and their custom resources in one spec: the implicit edge, when
a CRD counts as applied, and how a 404 for a kind that is not (yet) served is classified.

The runtime talks to a scripted API server here (answers as kube-apiserver gives them,
including its plain-text ``404 page not found``); the real one is exercised by
tests/integration/test_kubernetes_crds.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stackflow.runtimes.kubernetes.runtime as kube_runtime
from stackflow.engine.graph import Graph, build_graph
from stackflow.model.spec import Spec
from stackflow.runtimes.base import (
    InvalidInput,
    NotFound,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.kubernetes.client import ApiError, KubeClient
from stackflow.runtimes.kubernetes.failures import (
    KindNotServed,
    NotReady,
    namespace_missing,
    unserved_error,
)
from stackflow.runtimes.kubernetes.manifest import ObjectRef
from stackflow.runtimes.kubernetes.readiness import (
    crd_served_kinds,
    custom_resource_definition,
    readiness,
)
from stackflow.runtimes.kubernetes.rules import custom_resources as kubernetes_custom_resources
from stackflow.runtimes.kubernetes.runtime import KubernetesRuntime

JSON = dict[str, Any]
GROUP = "monitoring.example.com"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
OPTS = RuntimeOptions(project="shop", workspace="prod", timeout_seconds=30)
PAGE_NOT_FOUND = ApiError(404, None, "404 page not found", "https://127.0.0.1:6443")
ABSENT = ApiError(404, {"reason": "NotFound", "message": "not found"}, "")


def crd_manifest(kind: str = "Prometheus", plural: str = "prometheuses") -> JSON:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural},
            "versions": [
                {"name": "v1", "served": True, "storage": True},
                {"name": "v1alpha1", "served": False, "storage": False},
            ],
        },
    }


def conditions(**states: str) -> list[JSON]:
    return [{"type": name, "status": value} for name, value in states.items()]


def with_status(manifest: JSON, **states: str) -> JSON:
    return {**manifest, "status": {"conditions": conditions(**states)}}


def prometheus(namespace: str = "monitoring") -> JSON:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Prometheus",
        "metadata": {"name": "prometheus", "namespace": namespace},
        "spec": {"replicas": 1},
    }


def kusion_id(obj: JSON) -> str:
    md = obj["metadata"]
    return ":".join(
        p for p in (obj["apiVersion"], obj["kind"], md.get("namespace"), md["name"]) if p
    )


def request(obj: JSON, **extensions: Any) -> ResourceRequest:
    return ResourceRequest(
        id=kusion_id(obj), type="Kubernetes", attributes=obj, extensions=extensions
    )


# ---- the implicit edge ---------------------------------------------------------------------


def spec_of(*resources: JSON) -> Spec:
    return Spec.model_validate({"resources": list(resources)})


def as_resource(obj: JSON, **extra: Any) -> JSON:
    return {"id": kusion_id(obj), "type": "Kubernetes", "attributes": obj, **extra}


def test_a_custom_resource_depends_on_the_crd_of_its_kind_in_the_same_spec() -> None:
    definition, item = crd_manifest(), prometheus()
    other = crd_manifest("Alertmanager", "alertmanagers")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}
    spec = spec_of(
        as_resource(item),  # listed first, no dependsOn
        as_resource(other),
        as_resource(definition),
        as_resource(namespace),
    )
    graph = build_graph(spec)
    assert graph.dependencies(kusion_id(item)) == [kusion_id(definition)]
    assert graph.dependencies(kusion_id(other)) == []
    order = graph.topological_order()
    assert order.index(kusion_id(definition)) < order.index(kusion_id(item))
    backwards = graph.reverse_topological_order()  # destroy: the custom resource first
    assert backwards.index(kusion_id(item)) < backwards.index(kusion_id(definition))


def test_the_edge_is_found_again_from_recorded_attributes_and_only_for_kubernetes() -> None:
    definition, item = crd_manifest(), prometheus()

    class Recorded:
        def __init__(self, obj: JSON, type_: str = "Kubernetes") -> None:
            self.id, self.type, self.attributes = kusion_id(obj), type_, obj

    found = kubernetes_custom_resources([Recorded(item), Recorded(definition)])
    assert found == {kusion_id(item): [kusion_id(definition)]}
    # another group, another kind, or not a Kubernetes resource: no edge
    elsewhere = {**item, "apiVersion": "other.example.com/v1"}
    assert kubernetes_custom_resources([Recorded(elsewhere), Recorded(definition)]) == {}
    assert kubernetes_custom_resources([Recorded(item, "OnPrem"), Recorded(definition)]) == {}
    graph = Graph.from_dependencies(
        {r.id: deps for r, deps in [(Recorded(item), [kusion_id(definition)])]}
        | {kusion_id(definition): []}
    )
    assert graph.reverse_topological_order()[0] == kusion_id(item)


def test_an_explicit_depends_on_and_the_implicit_edge_agree() -> None:
    definition, item = crd_manifest(), prometheus()
    spec = spec_of(as_resource(definition), as_resource(item, dependsOn=[kusion_id(definition)]))
    assert build_graph(spec).dependencies(kusion_id(item)) == [kusion_id(definition)]


# ---- when a CRD counts as applied ----------------------------------------------------------


def test_a_crd_is_ready_once_established_with_its_names_accepted() -> None:
    bare = crd_manifest()
    assert not custom_resource_definition(bare).ready
    named = with_status(bare, NamesAccepted="True")
    assert custom_resource_definition(named).message == "not established yet"
    both = with_status(bare, NamesAccepted="True", Established="True")
    assert custom_resource_definition(both).ready and readiness(both).ready
    taken = with_status(bare, NamesAccepted="False")
    taken["status"]["conditions"][0]["message"] = 'the plural "prometheuses" is already in use'
    state = readiness(taken)
    assert state.failed and "already in use" in state.message
    going = {**both, "metadata": {**both["metadata"], "deletionTimestamp": "2026-11-24T18:00:00Z"}}
    assert readiness(going).failed
    assert crd_served_kinds(bare) == [(f"{GROUP}/v1", "Prometheus")]  # v1alpha1 is not served


# ---- classification ------------------------------------------------------------------------


def test_404_that_names_the_namespace_is_the_namespace_case_only() -> None:
    ns = ApiError(
        404,
        {"reason": "NotFound", "message": 'namespaces "monitoring" not found',
         "details": {"name": "monitoring", "kind": "namespaces"}},
        "",
    )  # fmt: skip
    assert namespace_missing(ns)
    assert not namespace_missing(PAGE_NOT_FOUND)
    route = ApiError(
        404,
        {"reason": "NotFound", "message": "the server could not find the requested resource"},
        "",
    )
    assert not namespace_missing(route)


def test_a_kind_on_its_way_is_unavailable_one_nothing_defines_is_bad_input() -> None:
    ref = ObjectRef(f"{GROUP}/v1", "Prometheus", "monitoring", "prometheus")
    rid = kusion_id(prometheus())
    waiting = unserved_error(
        rid, ref, f"its CustomResourceDefinition prometheuses.{GROUP} is not established yet", True
    )
    assert isinstance(waiting, Unavailable) and waiting.retryable
    reason = (
        f"the API group '{GROUP}' is not served and no CustomResourceDefinition defines kind "
        "Prometheus"
    )
    missing = unserved_error(rid, ref, reason, False)
    assert isinstance(missing, InvalidInput) and not missing.retryable
    assert str(missing).startswith(f"{rid}: the API server does not serve kind Prometheus")
    assert "namespace" not in str(missing)
    unknown = unserved_error(rid, ref, "", None)  # RBAC did not let us look
    assert isinstance(
        unknown, InvalidInput
    ) and "CustomResourceDefinition of kind Prometheus" in str(unknown)


# ---- a scripted API server -----------------------------------------------------------------


class Server:
    """kube-apiserver as the runtime sees it: discovery per group/version, CRDs, and the
    answers to server-side applies (a list per path, the last one repeating)."""

    def __init__(self) -> None:
        self.discovery: dict[str, list[JSON]] = {}
        self.crds: dict[str, JSON] = {}
        self.patches: dict[str, list[JSON | ApiError]] = {}
        self.gets: dict[str, list[JSON | ApiError]] = {}
        self.sent: list[tuple[str, str]] = []
        self.on_request: Callable[[str, str], None] = lambda method, path: None

    def serve(self, api_version: str, kind: str, plural: str, namespaced: bool = True) -> None:
        self.discovery.setdefault(api_version, []).append(
            {"name": plural, "kind": kind, "namespaced": namespaced}
        )

    def answer(self, method: str, path: str) -> JSON:
        self.sent.append((method, path))
        self.on_request(method, path)
        queue = (self.patches if method == "PATCH" else self.gets).get(path)
        if queue:
            found = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(found, ApiError):
                raise found
            return found
        if method == "GET" and path.startswith(CRDS):
            name = path[len(CRDS) + 1 :]
            if not name:
                return {"items": list(self.crds.values()), "metadata": {}}
            if name in self.crds:
                return self.crds[name]
        elif method == "GET" and path in ("/apis", "/api"):
            return {"groups": []}
        elif method == "GET" and path.startswith("/apis/"):
            parts = path.split("/")[2:]
            if len(parts) == 2 and "/".join(parts) in self.discovery:
                return {"resources": self.discovery["/".join(parts)]}
            if len(parts) == 1:
                versions = [v.split("/")[1] for v in self.discovery if v.split("/")[0] == parts[0]]
                if versions:
                    return {"versions": [{"version": v} for v in versions]}
        elif method == "GET" and path.count("/") >= 6:  # an object: not there
            raise ApiError(404, {"reason": "NotFound", "message": "not found"}, "")
        raise ApiError(404, None, "404 page not found", "https://127.0.0.1:6443")


class ScriptedClient(KubeClient):
    def __init__(self, server: Server) -> None:
        super().__init__(api=None, label="https://127.0.0.1:6443")  # type: ignore[arg-type]
        self.server = server

    def exchange(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: JSON | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, JSON]:
        return 200, self.server.answer(method, path)

    def close(self) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Server:
    monkeypatch.setattr(kube_runtime, "DISCOVERY_WAIT_SECONDS", 0.6)
    monkeypatch.setattr(kube_runtime.time, "sleep", lambda seconds: None)
    return Server()


async def run(server: Server, step: str, obj: JSON, **extensions: Any) -> Any:
    rt = KubernetesRuntime()
    client = ScriptedClient(server)
    rt.client_for = lambda resource, options: client  # type: ignore[method-assign]
    try:
        return await getattr(rt, step)(request(obj, **extensions), OPTS)
    finally:
        await rt.close()


CR_PATH = f"/apis/{GROUP}/v1/namespaces/monitoring/prometheuses/prometheus"


def applied(obj: JSON) -> JSON:
    return {**obj, "metadata": {**obj["metadata"], "uid": "u1", "resourceVersion": "7"}}


async def test_a_stale_route_is_discovered_again_and_the_apply_retried(server: Server) -> None:
    # discovery says served (cached from before the CRD was deleted and made again, or a
    # CRD just established) but the server answers 404 page not found once
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.crds[f"prometheuses.{GROUP}"] = with_status(
        crd_manifest(), NamesAccepted="True", Established="True"
    )
    server.patches[CR_PATH] = [PAGE_NOT_FOUND, applied(prometheus())]
    live = await run(server, "apply", prometheus())
    assert live["spec"] == {"replicas": 1}
    assert [m for m, p in server.sent if p == CR_PATH and m == "PATCH"] == ["PATCH", "PATCH"]
    assert ("GET", f"/apis/{GROUP}/v1") in server.sent[server.sent.index(("PATCH", CR_PATH)) :]


async def test_a_kind_whose_crd_is_being_established_is_unavailable(server: Server) -> None:
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.patches[CR_PATH] = [PAGE_NOT_FOUND]

    def crd_appears(method: str, path: str) -> None:
        # the first 404 made the runtime look again: by now the CRD was deleted and is being
        # made again, not established yet, so discovery no longer lists the kind
        if method == "PATCH":
            server.discovery.pop(f"{GROUP}/v1", None)
            server.crds[f"prometheuses.{GROUP}"] = with_status(crd_manifest(), NamesAccepted="True")

    server.on_request = crd_appears
    with pytest.raises(Unavailable) as err:
        await run(server, "apply", prometheus())
    message = str(err.value)
    assert message.startswith(
        f"{kusion_id(prometheus())}: the API server does not serve kind Prometheus"
    )
    assert "is not established yet" in message and "namespace" not in message
    assert err.value.retryable


async def test_a_kind_no_crd_defines_is_bad_input_naming_the_kind(server: Server) -> None:
    # stale discovery, and the CRD is gone for good (nothing in the cluster defines the kind)
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.patches[CR_PATH] = [PAGE_NOT_FOUND]
    server.on_request = lambda method, path: server.discovery.clear() if method == "PATCH" else None
    with pytest.raises(InvalidInput) as err:
        await run(server, "apply", prometheus())
    message = str(err.value)
    assert "kind Prometheus" in message
    assert "no CustomResourceDefinition defines kind Prometheus" in message
    assert "does its namespace exist" not in message


async def test_a_kind_nothing_serves_names_the_missing_crd_when_its_group_has_others(
    server: Server,
) -> None:
    server.serve(f"{GROUP}/v1", "Alertmanager", "alertmanagers")  # the group has other kinds
    with pytest.raises(InvalidInput) as err:
        await run(server, "apply", prometheus())
    assert f"{GROUP}/v1 has no kind Prometheus and no CustomResourceDefinition defines it" in str(
        err.value
    )


async def test_a_missing_namespace_keeps_the_namespace_message(server: Server) -> None:
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.patches[CR_PATH] = [
        ApiError(
            404,
            {"reason": "NotFound", "message": 'namespaces "monitoring" not found',
             "details": {"name": "monitoring", "kind": "namespaces"}},
            "",
        )
    ]  # fmt: skip
    with pytest.raises(NotFound) as err:
        await run(server, "apply", prometheus())
    assert not isinstance(err.value, KindNotServed)
    assert "does its namespace exist?" in str(err.value)


async def test_preview_of_a_kind_not_served_yet_is_its_manifest(server: Server) -> None:
    # nothing in the cluster (its CRD comes earlier in the same run): Create, no error
    result = await run(server, "preview", prometheus())
    assert result.would_be["spec"] == {"replicas": 1}
    # discovery cached from before: the dry run's 404 page not found is a Create too
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.patches[CR_PATH] = [PAGE_NOT_FOUND]
    result = await run(server, "preview", prometheus())
    assert result.would_be["kind"] == "Prometheus"


async def test_a_custom_resource_whose_kind_is_gone_counts_as_deleted(server: Server) -> None:
    # discovery cached from before its CRD was deleted: every request for the object is
    # answered 404 page not found
    server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")
    server.gets[CR_PATH] = [PAGE_NOT_FOUND]
    assert await run(server, "delete", prometheus()) is None
    assert await run(server, "read", prometheus()) is None
    # and with discovery asked again: the kind is not served, nothing to delete
    server.discovery.clear()
    assert await run(server, "delete", prometheus()) is None
    assert ("DELETE", CR_PATH) not in server.sent


# ---- applying a CRD ------------------------------------------------------------------------


CRD_PATH = f"{CRDS}/prometheuses.{GROUP}"


def serve_crds(server: Server) -> None:
    server.serve(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
    )


async def test_applying_a_crd_waits_until_its_kind_is_served(server: Server) -> None:
    serve_crds(server)
    server.patches[CRD_PATH] = [crd_manifest()]  # no conditions yet
    steps = [
        with_status(crd_manifest(), NamesAccepted="True"),
        with_status(crd_manifest(), NamesAccepted="True", Established="True"),
    ]
    server.gets[CRD_PATH] = [ABSENT, *steps]  # absent when the apply reads it first

    def established(method: str, path: str) -> None:
        # discovery lists the kind only once the CRD was read as Established
        ready = len(server.gets[CRD_PATH]) == 1
        if path == f"/apis/{GROUP}/v1" and ready and f"{GROUP}/v1" not in server.discovery:
            server.serve(f"{GROUP}/v1", "Prometheus", "prometheuses")

    server.on_request = established
    live = await run(server, "apply", crd_manifest())
    assert "status" not in live
    reads = [p for m, p in server.sent if m == "GET" and p == CRD_PATH]
    assert len(reads) >= 2  # read again until Established
    assert server.sent[-1] == ("GET", f"/apis/{GROUP}/v1")  # and its kind discovered


async def test_a_crd_whose_names_are_taken_fails_at_once(server: Server) -> None:
    serve_crds(server)
    taken = with_status(crd_manifest(), NamesAccepted="False")
    taken["status"]["conditions"][0]["message"] = '"prometheuses" is already in use'
    server.patches[CRD_PATH] = [taken]
    with pytest.raises(InvalidInput, match=r"names are not accepted: .*already in use"):
        await run(server, "apply", crd_manifest())


async def test_a_crd_never_established_is_not_ready_after_its_timeout(server: Server) -> None:
    serve_crds(server)
    server.patches[CRD_PATH] = [crd_manifest()]
    server.gets[CRD_PATH] = [ABSENT, with_status(crd_manifest(), NamesAccepted="True")]
    with pytest.raises(
        NotReady, match=r"does not serve its kind 0\.3s after it was applied: not established yet"
    ):
        await run(server, "apply", crd_manifest(), readinessTimeout="300ms")


async def test_a_bad_readiness_timeout_on_a_crd_is_refused_before_it_is_applied(
    server: Server,
) -> None:
    serve_crds(server)
    with pytest.raises(InvalidInput, match=r"extensions\.readinessTimeout 'soon'"):
        await run(server, "apply", crd_manifest(), readinessTimeout="soon")
    assert server.sent == []


async def test_a_crd_deleted_while_it_is_waited_for_is_retried(server: Server) -> None:
    serve_crds(server)
    server.patches[CRD_PATH] = [crd_manifest()]
    going = with_status(crd_manifest(), NamesAccepted="True")
    going["metadata"] = {**going["metadata"], "deletionTimestamp": "2026-11-24T18:00:00Z"}
    server.gets[CRD_PATH] = [ABSENT, going]
    with pytest.raises(Unavailable, match="is being deleted; applying once it is gone"):
        await run(server, "apply", crd_manifest())
