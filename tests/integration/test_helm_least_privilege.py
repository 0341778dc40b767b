"""The Helm chart's least privilege: RBAC, NetworkPolicies, secrets only from Secrets.

- RBAC: every rendered binding's rules are read. With the default values no
  ClusterRoleBinding grants a write verb (only the read-only `…-read` ClusterRole);
  `targetNamespaces` renders a Role and RoleBinding per namespace; only `clusterWide: true`
  renders cluster-wide writes. Then the rendered RBAC is applied for real into throwaway
  namespaces of the dev kube-apiserver (RBAC authorisation on), and the Kubernetes runtime,
  authenticated with a token of the rendered ServiceAccount, previews, applies, lists, waits
  for and deletes objects in its target namespace and is refused (403, one line) in another
  namespace, in the release's own (its Secrets) and for cluster-scoped writes;
  `kubectl auth can-i --as=system:serviceaccount:…` agrees.
- NetworkPolicies: which connections the rendered policies let through, read as the API
  defines them (the dev cluster's pods are kwok's and run nothing, and no network plugin
  enforces anything there: kubeconform and the server-side dry run of test_helm_chart.py
  validate the objects).
- Secrets: values that would put a secret into a manifest are refused by `helm template`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from stackflow.runtimes.base import InvalidInput, RuntimeOptions, read_scope
from stackflow.runtimes.kubernetes import KubernetesRuntime
from tests.integration.conftest import require_env
from tests.integration.helmhelp import (
    ALL_VALUES,
    Obj,
    Pod,
    Render,
    Tools,
    connects,
    find_tools,
    granted,
    helm_template,
    refused,
    release_pods,
    run,
    selects,
    write_verbs,
)
from tests.integration.kubehelp import (
    config_map,
    deployment,
    namespace,
    request,
    secret,
    widget,
)

pytestmark = pytest.mark.integration

SA = "rel-stackflow-worker-kubernetes"
RUNTIME_VERBS = {"get", "list", "create", "patch", "delete"}


@pytest.fixture(scope="module")
def tools() -> Tools:
    return find_tools()


# ---- RBAC, as rendered ------------------------------------------------------------------------


def cluster_writes(render: Render) -> dict[str, set[str]]:
    """ClusterRoleBinding name -> the write verbs it grants (bindings that grant none left
    out)."""
    found = {}
    for binding in render.of_kind("ClusterRoleBinding"):
        verbs = write_verbs(granted(render, binding))
        if verbs:
            found[binding["metadata"]["name"]] = verbs
    return found


def test_default_values_grant_no_write_right_cluster_wide(tools: Tools) -> None:
    render = helm_template(tools, "sf")
    assert cluster_writes(render) == {}
    assert not render.of_kind("Role") and not render.of_kind("RoleBinding")
    # what remains cluster-wide is the read-only role, named so, bound to the worker alone
    [role] = render.of_kind("ClusterRole")
    [binding] = render.of_kind("ClusterRoleBinding")
    assert role["metadata"]["name"] == binding["roleRef"]["name"] == f"sf-{SA}-read"
    assert role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list"],
        },
        {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"], "verbs": ["get"]},
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": "sf"}]
    # an existing ClusterRole (`edit`, `cluster-admin`) is bound per namespace, never cluster-wide
    render = helm_template(
        tools,
        "sf",
        "--set",
        "workers.kubernetes.rbac.existingClusterRole=cluster-admin",
        "--set",
        "workers.kubernetes.rbac.targetNamespaces={apps}",
    )
    assert cluster_writes(render) == {}
    [binding] = render.of_kind("RoleBinding")
    assert binding["metadata"]["namespace"] == "apps"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "cluster-admin",
    }


def test_target_namespaces_get_a_role_each_with_what_the_runtime_needs(tools: Tools) -> None:
    render = helm_template(
        tools, "sf", "--set", "workers.kubernetes.rbac.targetNamespaces={apps,web}"
    )
    assert cluster_writes(render) == {}
    roles = {r["metadata"]["namespace"]: r for r in render.of_kind("Role")}
    bindings = {b["metadata"]["namespace"]: b for b in render.of_kind("RoleBinding")}
    assert set(roles) == set(bindings) == {"apps", "web"}
    for ns, binding in bindings.items():
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": "sf"}]
        rules = granted(render, binding)
        assert rules == roles[ns]["rules"]
        for rule in rules:
            assert set(rule["verbs"]) == RUNTIME_VERBS, rule
            assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], rule
        resources = {r for rule in rules for r in rule["resources"]}
        assert {"deployments", "secrets", "configmaps", "serviceaccounts"} <= resources
        # nothing that is not namespaced, nor RBAC, nor exec into pods
        assert not resources & {"namespaces", "customresourcedefinitions", "roles", "pods/exec"}


def test_only_cluster_wide_on_grants_cluster_wide_writes(tools: Tools) -> None:
    render = helm_template(tools, "sf", "--set", "workers.kubernetes.rbac.clusterWide=true")
    writes = cluster_writes(render)
    assert writes == {f"sf-{SA}": {"create", "patch", "delete"}}
    rules = granted(render, render.named("ClusterRoleBinding", f"sf-{SA}"))
    resources = {r for rule in rules for r in rule["resources"]}
    assert {"deployments", "daemonsets", "secrets", "serviceaccounts", "namespaces"} <= resources
    assert not render.of_kind("Role") and not render.of_kind("RoleBinding")
    # and an existing ClusterRole, cluster-wide, only so
    render = helm_template(
        tools,
        "sf",
        "--set",
        "workers.kubernetes.rbac.clusterWide=true",
        "--set",
        "workers.kubernetes.rbac.existingClusterRole=edit",
    )
    assert cluster_writes(render) == {f"sf-{SA}": {"*"}}  # a role the chart does not know
    assert render.named("ClusterRoleBinding", f"sf-{SA}")["roleRef"]["name"] == "edit"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            [
                "--set",
                "workers.kubernetes.rbac.clusterWide=true",
                "--set",
                "workers.kubernetes.rbac.targetNamespaces={apps}",
            ],
            "workers.kubernetes.rbac: clusterWide grants every namespace",
        ),
        # the old key, which bound a ClusterRole cluster-wide when empty, is gone
        (
            ["--set", "workers.kubernetes.rbac.namespaces={apps}"],
            "additional properties 'namespaces' not allowed",
        ),
        (
            ["--set", "workers.kubernetes.rbac.targetNamespaces={Not_A_Namespace}"],
            "targetNamespaces/0",
        ),
    ],
)
def test_rbac_values_are_checked(tools: Tools, args: list[str], error: str) -> None:
    assert error in refused(tools, *args)


# ---- RBAC, applied and used --------------------------------------------------------------------


@pytest.fixture
def live_namespaces(tools: Tools) -> Iterator[tuple[str, str, str]]:
    """(release, target, other): three throwaway namespaces; the release's cluster-scoped
    read-only role and binding are removed with them."""
    require_env("KUBECONFIG")
    tag = uuid.uuid4().hex[:8]
    names = (f"sf-rel-{tag}", f"sf-apps-{tag}", f"sf-other-{tag}")
    for name in names:
        run(tools.kubectl, "create", "namespace", name)
    yield names
    read = f"{names[0]}-{SA}-read"
    run(tools.kubectl, "delete", "clusterrolebinding,clusterrole", read, check=False)
    run(tools.kubectl, "delete", "namespace", *names, "--wait=false", check=False)


def token_kubeconfig(tools: Tools, release: str, path: Path) -> str:
    """A kubeconfig of the dev cluster that authenticates as the rendered ServiceAccount
    (a token from the TokenRequest API, as the pod's projected token would be)."""
    token = run(
        tools.kubectl, "create", "token", SA, "-n", release, "--duration", "600s"
    ).stdout.strip()
    admin = json.loads(
        run(tools.kubectl, "config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "worker", "user": {"token": token}}],
        "contexts": [{"name": "worker", "context": {"cluster": "dev", "user": "worker"}}],
        "current-context": "worker",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def can_i(tools: Tools, release: str, verb: str, resource: str, namespace: str = "") -> bool:
    where = ["-n", namespace] if namespace else ["--all-namespaces"]
    as_worker = f"--as=system:serviceaccount:{release}:{SA}"
    proc = run(tools.kubectl, "auth", "can-i", verb, resource, *where, as_worker, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


async def test_the_rendered_worker_works_in_its_namespace_and_writes_nowhere_else(
    tools: Tools,
    live_namespaces: tuple[str, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, target, other = live_namespaces
    render = helm_template(
        tools, release, "--set", f"workers.kubernetes.rbac.targetNamespaces={{{target}}}"
    )
    rbac = [
        o
        for o in render.objects
        if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
        or (o["kind"] == "ServiceAccount" and o["metadata"]["name"] == SA)
    ]
    assert {o["kind"] for o in rbac} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(rbac))
    run(tools.kubectl, "apply", "--server-side", "-f", str(manifest))
    # stackflow's own Secret in the release's namespace: what a stack must never reach
    planted = f"postgresql://stackflow:pw-{uuid.uuid4().hex}@db/stackflow"
    run(
        tools.kubectl,
        *("create", "secret", "generic", "stackflow-state", "-n", release),
        f"--from-literal=url={planted}",
    )

    # what RBAC says
    for verb in RUNTIME_VERBS:
        for resource in ("deployments.apps", "secrets", "configmaps", "serviceaccounts"):
            assert can_i(tools, release, verb, resource, target), (verb, resource)
            assert not can_i(tools, release, verb, resource, other), (verb, resource)
    assert not can_i(tools, release, "get", "secrets", release)
    assert not can_i(tools, release, "list", "secrets", release)
    for verb, resource in [
        ("create", "namespaces"),
        ("delete", "namespaces"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("create", "rolebindings.rbac.authorization.k8s.io"),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "pods/exec"),
        ("update", "deployments.apps"),
        ("deletecollection", "secrets"),
    ]:
        assert not can_i(tools, release, verb, resource, target), (verb, resource)
        assert not can_i(tools, release, verb, resource), (verb, resource)
    assert can_i(tools, release, "list", "customresourcedefinitions.apiextensions.k8s.io")

    # what the runtime does with the ServiceAccount's own token
    monkeypatch.setenv("KUBECONFIG", token_kubeconfig(tools, release, tmp_path / "worker.yaml"))
    monkeypatch.delenv("STACKFLOW_ALLOWED_KUBECONFIGS", raising=False)
    rt = KubernetesRuntime()
    opts = RuntimeOptions(project="p-rbac", workspace="dev", timeout_seconds=120)
    try:
        objs = [
            config_map(target, "settings", {"mode": "fast"}),
            secret(target, "creds", {"password": "hunter2-rbac"}),
            deployment(target, "web"),
        ]
        for obj in objs:
            assert (await rt.preview(request(obj), opts)).would_be is not None
            applied = await rt.apply(request(obj), opts)
            await rt.wait_ready(request(obj, prior=applied), opts)
        with read_scope("rbac-run", objs):  # a preview batch: one LIST per kind
            assert all([await rt.read(request(obj), opts) for obj in objs])
        for obj in objs:
            await rt.delete(request(obj), opts)
            assert await rt.read(request(obj), opts) is None

        # a kind nothing serves fails at once, naming why (the read-only ClusterRole: CRDs)
        with pytest.raises(InvalidInput) as caught:
            await rt.apply(
                request(widget(f"rbac{uuid.uuid4().hex[:6]}.io", target, "w", "red")), opts
            )
        assert "no CustomResourceDefinition defines kind Widget" in str(caught.value)

        refusals = [
            (rt.apply, config_map(other, "settings", {"mode": "fast"})),
            (rt.preview, config_map(other, "settings", {"mode": "fast"})),
            (rt.read, secret(release, "stackflow-state", {"url": "x"})),
            (rt.apply, namespace(f"{other}-new")),
        ]
        for call, obj in refusals:
            with pytest.raises(InvalidInput) as caught:
                await call(request(obj), opts)
            message = str(caught.value)
            assert "forbidden" in message and f"system:serviceaccount:{release}:{SA}" in message
            assert "\n" not in message and planted not in message
    finally:
        await rt.close()
        monkeypatch.undo()  # kubectl below: the admin again
    # nothing was made outside the target namespace
    for ns in (other, release):
        listed = run(tools.kubectl, "get", "configmap,deployment", "-n", ns, "-o", "name")
        assert "settings" not in listed.stdout and "web" not in listed.stdout
    assert run(tools.kubectl, "get", "namespace", f"{other}-new", check=False).returncode != 0


# ---- NetworkPolicies -----------------------------------------------------------------------------


def policies(render: Render) -> list[Obj]:
    return render.of_kind("NetworkPolicy")


def test_default_policies_let_in_only_the_api_and_codec_ports(tools: Tools) -> None:
    render = helm_template(tools, "sf")
    nps = policies(render)
    pods = release_pods(render, "sf")
    assert set(pods) == {"worker", "worker-kubernetes", "api", "codec"}
    # every pod of the release is under a policy with no ingress rule
    deny = render.named("NetworkPolicy", "rel-stackflow-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    assert all(selects(deny["spec"]["podSelector"], pod.labels) for pod in pods.values())
    # it selects nothing else in the namespace (another release of the chart included)
    assert not selects(deny["spec"]["podSelector"], {"app.kubernetes.io/instance": "other"})
    elsewhere = Pod("team-a", {"app": "client"})
    neighbour = Pod("sf", {"app": "client"})
    for src in (elsewhere, neighbour, pods["worker"]):
        assert connects(nps, src, pods["api"], 8080)
        assert connects(nps, src, pods["codec"], 8081)
        assert not connects(nps, src, pods["api"], 9464)  # only the port
        for worker in ("worker", "worker-kubernetes"):
            for port in (8080, 9464, 22):
                assert not connects(nps, src, pods[worker], port), (src, worker, port)
    outside = Pod("", ip="203.0.113.9")  # not a pod: outside the cluster
    assert not connects(nps, outside, pods["api"], 8080)
    # egress stays open by default
    assert connects(nps, pods["worker"], Pod("temporal", {"app": "frontend"}), 7233)
    assert connects(nps, pods["codec"], outside, 443)
    # turned off: none
    off = helm_template(tools, "sf", "--set", "networkPolicy.enabled=false")
    assert policies(off) == []


def test_all_values_policies_let_through_only_what_must_talk(tools: Tools) -> None:
    render = helm_template(tools, "sf", "-f", str(ALL_VALUES))
    nps = policies(render)
    pods = release_pods(render, "sf")
    workers = [c for c in pods if c.startswith("worker")]
    assert len(workers) == 4
    ingress_nginx = Pod("ingress-nginx", {"app": "controller"})
    monitoring = Pod("monitoring", {"app": "prometheus"})
    temporal_ui = Pod("temporal", {"app.kubernetes.io/component": "web"})
    frontend = Pod("temporal", {"app.kubernetes.io/component": "frontend"})
    postgres = Pod("sf", {"app.kubernetes.io/name": "postgresql"})
    redis = Pod("sf", {"app.kubernetes.io/name": "redis"})
    stranger = Pod("team-a", {"app": "client"})
    neighbour = Pod("sf", {"app": "client"})

    # in: the API from the ingress controller, the codec from it and the Temporal UI,
    # the workers' metrics from monitoring; nothing else
    assert connects(nps, ingress_nginx, pods["api"], 8080)
    assert not connects(nps, stranger, pods["api"], 8080)
    assert connects(nps, temporal_ui, pods["codec"], 8081)
    assert not connects(nps, frontend, pods["codec"], 8081)
    for worker in workers:
        assert connects(nps, monitoring, pods[worker], 9464)
        assert not connects(nps, monitoring, pods[worker], 8080)
        assert not connects(nps, stranger, pods[worker], 9464)
    # the database and Redis: the workers and the API only (plus Temporal's extraFrom on the
    # database), not the codec server, not a neighbour
    for client in [*workers, "api"]:
        assert connects(nps, pods[client], postgres, 5432), client
        assert connects(nps, pods[client], redis, 6379), client
        assert not connects(nps, pods[client], postgres, 6379), client
    for src in (pods["codec"], neighbour, stranger):
        assert not connects(nps, src, postgres, 5432)
        assert not connects(nps, src, redis, 6379)
    assert connects(nps, frontend, postgres, 5432)
    assert not connects(nps, frontend, redis, 6379)
    # out: DNS, Temporal's frontend and the collector for all; the API server for the
    # Kubernetes worker; the internet on 443 for Terraform and the codec (OIDC keys)
    dns = Pod("kube-system", {"k8s-app": "kube-dns"})
    apiserver = Pod("", ip="10.0.0.1")
    internet = Pod("", ip="198.51.100.7")
    for component, pod in pods.items():
        assert connects(nps, pod, dns, 53, "UDP"), component
        assert connects(nps, pod, frontend, 7233), component
        assert not connects(nps, pod, stranger, 80), component
        assert connects(nps, pod, apiserver, 6443) is (component == "worker-kubernetes")
        assert connects(nps, pod, internet, 443) is (component in ("worker-terraform", "codec"))
    assert not connects(nps, pods["worker-terraform"], Pod("", ip="10.1.2.3"), 443)


def test_restricting_egress_without_a_destination_is_refused(tools: Tools) -> None:
    error = refused(tools, "--set", "networkPolicy.egress.restrict=true")
    assert "networkPolicy.egress.restrict: list where the pods may connect" in error
    error = refused(tools, "--set", "networkPolicy.database.enabled=true")
    assert "networkPolicy.database.podSelector: the labels of the database's pods" in error


# ---- secrets only from Secrets ------------------------------------------------------------------

PLANTED = "s3cr3t-planted-value-0123456789"


def env_values(where: str, entry: Obj) -> Obj:
    """Values with one extraEnv ``entry`` for the component at ``where`` (`workers.main`)."""
    values: Obj = {"extraEnv": [entry]}
    for key in reversed(where.split(".")):
        values = {key: values}
    return values


CONFIG_MAP_REF = {"configMapKeyRef": {"name": "cfg", "key": "url"}}


@pytest.mark.parametrize(
    ("where", "entry", "error"),
    [
        # the codec token as a literal, beside secrets.codecToken
        ("codec", {"name": "STACKFLOW_CODEC_TOKEN", "value": PLANTED}, "holds a secret"),
        # the key itself instead of the key file
        ("workers.main", {"name": "STACKFLOW_ENCRYPTION_KEY", "value": f"k1:{PLANTED}"}, ""),
        # Temporal Cloud's API key; a TLS key inline
        ("api", {"name": "TEMPORAL_API_KEY", "value": PLANTED}, "holds a secret"),
        ("workers.kubernetes", {"name": "TEMPORAL_TLS_CLIENT_KEY_DATA", "value": PLANTED}, ""),
        # the state URL from a ConfigMap (which a Secret should hold)
        ("api", {"name": "STACKFLOW_STATE_URL", "valueFrom": CONFIG_MAP_REF}, "not a value"),
        # the collector's credentials as headers; Redis' password in a lower-case name
        ("workers.terraform", {"name": "OTEL_EXPORTER_OTLP_HEADERS", "value": PLANTED}, ""),
        ("api", {"name": "redis_password", "value": PLANTED}, "holds a secret"),
        # a password in a URL under an innocent name
        (
            "workers.onprem",
            {"name": "MY_DB", "value": f"postgresql://u:{PLANTED}@db/x"},
            "workers.onprem.extraEnv: MY_DB is a URL with a password",
        ),
    ],
)
def test_a_secret_value_in_extra_env_is_refused(
    tools: Tools, tmp_path: Path, where: str, entry: Obj, error: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(env_values(where, entry)))
    stderr = refused(tools, "-f", str(path))
    assert f"{where}.extraEnv: {entry['name']} " in stderr, stderr
    assert error in stderr, stderr
    assert PLANTED not in stderr


@pytest.mark.parametrize(
    "args",
    [
        ["tracing.enabled=true", f"tracing.endpoint=https://otel:{PLANTED}@collector:4318"],
        [
            "codec.oidc.issuer=https://idp",
            "codec.oidc.audience=ui",
            f"codec.oidc.jwksUrl=https://u:{PLANTED}@idp/keys",
        ],
    ],
)
def test_a_password_in_a_plain_url_value_is_refused(tools: Tools, args: list[str]) -> None:
    where = args[-1].partition("=")[0]
    stderr = refused(tools, *(a for arg in args for a in ("--set", arg)))
    assert f"{where}: a URL with a password" in stderr, stderr
    assert PLANTED not in stderr


def test_secret_references_and_file_paths_pass(tools: Tools, tmp_path: Path) -> None:
    """What the refusals above must not catch: secretKeyRef, key and certificate file paths,
    URLs without a password, plain settings."""
    env = [
        {"name": "TEMPORAL_API_KEY", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}},
        {"name": "TEMPORAL_TLS_CLIENT_KEY_PATH", "value": "/etc/temporal/tls/tls.key"},
        {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/etc/gcp/credentials.json"},
        {"name": "STACKFLOW_API_URL", "value": "https://stackflow.example.com"},
        {"name": "STACKFLOW_FOUR_EYES", "value": "prod-*"},
    ]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"workers": {"main": {"extraEnv": env}}}))
    render = helm_template(tools, "sf", "-f", str(path))
    main = render.named("Deployment", "rel-stackflow-worker")
    names = {e["name"] for e in main["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {e["name"] for e in env} <= names
