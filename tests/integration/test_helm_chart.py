"""The Helm chart (deploy/helm/stackflow) with the real tools and the dev kube-apiserver.

`helm lint`, then `helm template` with the default values, with every optional part on
(ci/all-values.yaml: all four workers, metrics, KEDA ScaledObjects and an HPA, kubeconfigs,
codec OIDC, NetworkPolicies with egress restricted and the database and Redis policies, a Role
in a target namespace) and with cluster-wide RBAC, each render checked by `kubeconform
-strict` against schemas written from the dev API server's own OpenAPI
(scripts/kube_schemas.py; KEDA's ScaledObject from its CRD in the KEDA module) and by
`kubectl apply --dry-run=server --validate=strict` into a namespace made for the test (the
ScaledObject CRD installed for it, unless the cluster has it, and removed after). Then
properties of the rendered objects: security contexts, one runtime per worker, RBAC for the
Kubernetes worker only, no secret value anywhere, the grace period. RBAC, NetworkPolicies and
secret refusals in depth: test_helm_least_privilege.py.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackflow.worker.main import GRACEFUL_SHUTDOWN
from stackflow.workflows.common import RESOURCE_HEARTBEAT
from tests.integration.conftest import REPO, require_env
from tests.integration.helmhelp import (
    ALL_VALUES,
    CHART,
    Obj,
    Render,
    Tools,
    find_tools,
    granted,
    helm_template,
    run,
    write_verbs,
)

pytestmark = pytest.mark.integration

RUNTIMES = ("kubernetes", "terraform", "onprem")
SCHEMA_LOCATION = "{{ .ResourceKind }}{{ .KindSuffix }}.json"


@pytest.fixture(scope="module")
def tools() -> Tools:
    return find_tools()


@pytest.fixture(scope="module")
def namespace(tools: Tools) -> Iterator[str]:
    require_env("KUBECONFIG")
    name = f"helm-chart-{uuid.uuid4().hex[:8]}"
    run(tools.kubectl, "create", "namespace", name)
    yield name
    run(tools.kubectl, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def renders(tools: Tools, namespace: str) -> dict[str, Render]:
    return {
        "default": helm_template(tools, namespace),
        # a Role and RoleBinding in the test's namespace (the default render: none)
        "all": helm_template(
            tools,
            namespace,
            "-f",
            str(ALL_VALUES),
            "--set",
            f"workers.kubernetes.rbac.targetNamespaces={{{namespace}}}",
        ),
        # the explicit opt-in to cluster-wide write rights
        "clusterwide": helm_template(
            tools, namespace, "--set", "workers.kubernetes.rbac.clusterWide=true"
        ),
    }


@pytest.fixture(scope="module")
def schemas(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kube-schemas")
    script = str(REPO / "scripts" / "kube_schemas.py")
    run(
        sys.executable,
        script,
        "--out",
        str(out),
        "--kubectl",
        tools.kubectl,
        "--crd",
        str(tools.keda_crd),
    )
    return out


@pytest.fixture(scope="module")
def scaledobject_crd(tools: Tools) -> Iterator[None]:
    name = "scaledobjects.keda.sh"
    # A CRD that an earlier session deleted with --wait=false may still be terminating: it is
    # listed, but serves no create. Wait for it to go before deciding whether it is there.
    run(tools.kubectl, "wait", "--for=delete", f"crd/{name}", "--timeout=60s", check=False)
    there = run(tools.kubectl, "get", "crd", name, check=False).returncode == 0
    if not there:
        run(tools.kubectl, "apply", "--server-side", "-f", str(tools.keda_crd))
    run(tools.kubectl, "wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    # Established is the CRD's condition; the resource is served once discovery lists it (a
    # POST before that is "could not find the requested resource"): wait for that too.
    deadline = time.monotonic() + 30
    while run(tools.kubectl, "get", name, "-A", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{name} is Established but not served after 30 s"
        time.sleep(0.2)
    yield
    if not there:
        run(tools.kubectl, "delete", "crd", name, "--wait=false", check=False)


def test_helm_lint_passes_with_default_and_all_values(tools: Tools) -> None:
    for extra in ([], ["-f", str(ALL_VALUES)]):
        proc = run(tools.helm, "lint", "--strict", str(CHART), *extra)
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout


def test_both_renders_pass_kubeconform_strict(
    tools: Tools, renders: dict[str, Render], schemas: Path, tmp_path: Path
) -> None:
    def kubeconform(path: Path) -> Obj:
        proc = run(
            tools.kubeconform,
            "-strict",
            "-summary",
            "-output",
            "json",
            "-schema-location",
            str(schemas / SCHEMA_LOCATION),
            str(path),
            check=False,
        )
        report: Obj = json.loads(proc.stdout)
        return report

    for name, render in renders.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(render.text)
        summary = kubeconform(path)["summary"]
        assert summary == {"valid": len(render.objects), "invalid": 0, "errors": 0, "skipped": 0}, (
            name,
            kubeconform(path),
        )
    assert len(renders["all"].of_kind("ScaledObject")) == 3  # checked against KEDA's CRD too
    # NetworkPolicies too: default-deny, API, codec (+ metrics, database, Redis, egress ones)
    assert len(renders["default"].of_kind("NetworkPolicy")) == 3
    assert len(renders["all"].of_kind("NetworkPolicy")) == 13

    # the schemas are strict: one unknown field in a pod spec and one in a ScaledObject fail
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        renders["all"]
        .text.replace("enableServiceLinks: false", "enableServiceLinks: false\n      bogus: 1", 1)
        .replace("  pollingInterval: 15", "  pollingInterval: 15\n  bogus: 1", 1)
    )
    report = kubeconform(bad)
    assert report["summary"]["invalid"] == 2, report
    assert all("additional properties 'bogus' not allowed" in r["msg"] for r in report["resources"])


def test_both_renders_pass_a_server_side_dry_run(
    tools: Tools,
    renders: dict[str, Render],
    namespace: str,
    scaledobject_crd: None,
    tmp_path: Path,
) -> None:
    for name, render in renders.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(render.text)
        proc = run(
            tools.kubectl,
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--namespace",
            namespace,
            "-f",
            str(path),
        )
        accepted = [line for line in proc.stdout.splitlines() if line.endswith("(server dry run)")]
        assert len(accepted) == len(render.objects), (name, proc.stdout)
        assert "Warning" not in proc.stderr, (name, proc.stderr)


def deployments(render: Render) -> dict[str, Obj]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in render.of_kind("Deployment")
    }


def test_every_deployment_runs_unprivileged_on_a_read_only_root(
    renders: dict[str, Render],
) -> None:
    assert set(deployments(renders["default"])) == {"worker", "worker-kubernetes", "api", "codec"}
    assert set(deployments(renders["all"])) == {
        "worker",
        *(f"worker-{r}" for r in RUNTIMES),
        "api",
        "codec",
    }
    for render in renders.values():
        for component, deployment in deployments(render).items():
            pod = deployment["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, component
            assert pod["securityContext"]["runAsUser"] == 10001, component
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
            [container] = pod["containers"]
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, component
            assert sc["allowPrivilegeEscalation"] is False, component
            assert sc["capabilities"] == {"drop": ["ALL"]}, component
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, component
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/data/stackflow"] in empty_dirs and mounts["/tmp"] in empty_dirs
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["STACKFLOW_HOME"] == "/data/stackflow", component
            assert env["STACKFLOW_ENCRYPTION_KEY_FILE"] == "/etc/stackflow/keys/keys.yaml"
            # the API and codec always probe over HTTP; workers only with metrics on
            probes = {k: container.get(k) for k in ("livenessProbe", "readinessProbe")}
            if component in ("api", "codec") or render is renders["all"]:
                assert all(p and "httpGet" in p for p in probes.values()), component
            else:
                assert probes == {"livenessProbe": None, "readinessProbe": None}, component


def test_each_worker_serves_one_runtime_queue_with_only_its_own_access(
    renders: dict[str, Render],
) -> None:
    render = renders["all"]
    workers = {c: d for c, d in deployments(render).items() if c.startswith("worker")}
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in render.of_kind("ScaledObject")}
    for component, deployment in workers.items():
        runtime = component.removeprefix("worker-") if "-" in component else "main"
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["args"] == ["stackflow", "worker", "--runtimes", runtime]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["STACKFLOW_RUNTIME_QUEUES"] == "on"
        assert env["STACKFLOW_TASK_QUEUE"] == "stackflow"
        assert env["STACKFLOW_METRICS_ADDRESS"] == "0.0.0.0:9464"
        assert env["STACKFLOW_TRACING"] == "otlp"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
        # one build per release: runs stay pinned to the build they started on
        assert env["STACKFLOW_WORKER_DEPLOYMENT"] == "stackflow"
        assert env["STACKFLOW_WORKER_BUILD_ID"] == "0.1.0-abc123"
        assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert pod["automountServiceAccountToken"] is (runtime == "kubernetes")
        assert ("STACKFLOW_ONPREM_ROOTS" in env) is (runtime == "onprem")
        assert ("STACKFLOW_TF_BIN" in env) is (runtime == "terraform")
        name = deployment["metadata"]["name"]
        if runtime == "onprem":  # an HPA, the others KEDA on their own queue's backlog
            assert render.named("HorizontalPodAutoscaler", name)
            assert "replicas" not in deployment["spec"]
            continue
        trigger = scaled[name]["spec"]["triggers"][0]
        queue = "stackflow" if runtime == "main" else f"stackflow-{runtime}"
        assert trigger["type"] == "temporal"
        assert trigger["metadata"]["taskQueue"] == queue
        assert trigger["metadata"]["queueTypes"] == (
            "workflow,activity" if runtime == "main" else "activity"
        )
        assert "replicas" not in deployment["spec"]  # the autoscaler owns it
    for deployment in deployments(renders["default"]).values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            names = {e["name"] for e in container["env"]}
            assert "STACKFLOW_WORKER_BUILD_ID" not in names
            assert "STACKFLOW_TRACING" not in names  # tracing is off by default
    # RBAC: bound to the Kubernetes worker's ServiceAccount only, never to RBAC objects
    for r in renders.values():
        for binding in r.of_kind("RoleBinding") + r.of_kind("ClusterRoleBinding"):
            [subject] = binding["subjects"]
            assert subject["name"] == "rel-stackflow-worker-kubernetes"
            assert not any("rbac.authorization.k8s.io" in g for g in _groups(granted(r, binding)))
    accounts = {a["metadata"]["name"]: a for a in render.of_kind("ServiceAccount")}
    assert len(accounts) == 6
    for name, account in accounts.items():
        assert account["automountServiceAccountToken"] is name.endswith("worker-kubernetes")
    # writes only in the target namespace (test_helm_least_privilege.py has the rest)
    [binding] = render.of_kind("RoleBinding")
    assert write_verbs(granted(render, binding)) == {"create", "patch", "delete"}
    assert not any(write_verbs(granted(render, b)) for b in render.of_kind("ClusterRoleBinding"))


def _groups(rules: list[Obj]) -> list[str]:
    return [group for rule in rules for group in rule.get("apiGroups", [])]


SENSITIVE_ENV = re.compile(
    r"(TOKEN|PASSWORD|SECRET|CREDENTIALS|_KEY|KEY_DATA|HEADERS|STATE_URL|REDIS_URL)$", re.I
)


def test_no_secret_values_are_rendered(
    tools: Tools, renders: dict[str, Render], namespace: str
) -> None:
    for name, render in renders.items():
        assert not render.of_kind("Secret") and not render.of_kind("ConfigMap"), name
        assert not re.search(r"(postgres(ql)?|redis)://", render.text), name
        for deployment in render.of_kind("Deployment"):
            [container] = deployment["spec"]["template"]["spec"]["containers"]
            for env in container["env"]:
                if SENSITIVE_ENV.search(env["name"]) and not env.get("value", "").startswith("/"):
                    assert set(env) == {"name", "valueFrom"}, (name, env)
                    assert "secretKeyRef" in env["valueFrom"], (name, env)
    # nowhere to put one: a value beside a Secret's name is refused by the values schema
    proc = run(
        tools.helm,
        "template",
        "rel",
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "secrets.stateUrl.value=postgresql://u:pw@db/stackflow",
        check=False,
    )
    assert proc.returncode != 0
    assert "additional properties 'value' not allowed" in proc.stderr, proc.stderr
    assert "pw@db" not in proc.stdout


def test_temporal_tls_and_api_key_come_from_secrets(renders: dict[str, Render]) -> None:
    """temporal.tls and temporal.apiKey (ci/all-values.yaml): the workers and the API get the
    Temporal CLI's variables, the client certificate and the CA mounted read-only from their
    Secrets, the API key by secretKeyRef; the codec server (which never calls Temporal) gets
    none of it, and neither does any component by default."""
    tls_dir = "/etc/stackflow/temporal-tls"
    for component, deployment in deployments(renders["all"]).items():
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        if component == "codec":
            assert not [n for n in env if n.startswith("TEMPORAL_TLS") or n == "TEMPORAL_API_KEY"]
            assert "temporal-tls" not in volumes
            continue
        assert env["TEMPORAL_TLS"]["value"] == "true", component
        assert env["TEMPORAL_TLS_CLIENT_CERT_PATH"]["value"] == f"{tls_dir}/client.crt"
        assert env["TEMPORAL_TLS_CLIENT_KEY_PATH"]["value"] == f"{tls_dir}/client.key"
        assert env["TEMPORAL_TLS_SERVER_CA_CERT_PATH"]["value"] == f"{tls_dir}/ca.crt"
        assert env["TEMPORAL_TLS_SERVER_NAME"]["value"] == "temporal.example.com"
        assert env["TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "stackflow-temporal-api-key",
            "key": "api-key",
        }
        assert mounts["temporal-tls"] == {
            "name": "temporal-tls",
            "mountPath": tls_dir,
            "readOnly": True,
        }
        sources = volumes["temporal-tls"]["projected"]["sources"]
        assert [s["secret"]["name"] for s in sources] == [
            "stackflow-temporal-client",
            "temporal-ca",
        ]
        assert [i["path"] for s in sources for i in s["secret"]["items"]] == [
            "client.crt",
            "client.key",
            "ca.crt",
        ]
        required = env.get("STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS", {}).get("value")
        assert required == ("1" if component.startswith("worker") else None), component
    for component, deployment in deployments(renders["default"]).items():
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        names = {e["name"] for e in container["env"]}
        assert not {n for n in names if n.startswith("TEMPORAL_TLS")}, component
        assert "STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS" not in names, component


def test_grace_period_outlasts_the_heartbeat_and_the_graceful_shutdown(
    renders: dict[str, Render],
) -> None:
    floor = RESOURCE_HEARTBEAT.total_seconds() + GRACEFUL_SHUTDOWN.total_seconds()
    assert floor == 25  # what values.yaml and values.schema.json say
    for render in renders.values():
        for component, deployment in deployments(render).items():
            if component.startswith("worker"):
                grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                assert grace > floor, (component, grace)
    assert (
        deployments(renders["all"])["worker-terraform"]["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        == 120
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--set", "workers.main.replicaz=2"], "additional properties 'replicaz' not allowed"),
        (["--set", "api.bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "metrics.bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "terminationGracePeriodSeconds=25"], "minimum: got 25, want 26"),
        (
            ["--set", "workers.kubernetes.terminationGracePeriodSeconds=20"],
            "minimum: got 20, want 26",
        ),
        (
            ["--set", "secrets.codecToken.name="],
            "codec: set secrets.codecToken.name or codec.oidc",
        ),
        (["--set", "workers.kubernetes.autoscaling.kind=vpa"], "value must be one of"),
        (
            ["--set", "workers.kubernetes.kubeconfigs.default=prod.yaml"],
            "kubeconfigs.default names a key of kubeconfigs.secretName, which is not set",
        ),
    ],
)
def test_values_are_checked(tools: Tools, args: list[str], error: str) -> None:
    proc = run(tools.helm, "template", "rel", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert error in proc.stderr, proc.stderr
