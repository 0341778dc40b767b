"""Helpers for the Helm chart tests: the tools, renders, RBAC rules and NetworkPolicy reading.

helm, kubeconform and the KEDA CRDs come from `scripts/setup.sh` (helm, kubeconform,
keda-crds); where scripts/lib.sh puts them is asked from scripts/lib.sh itself.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import REPO, require_env

CHART = REPO / "deploy" / "helm" / "stackflow"
ALL_VALUES = CHART / "ci" / "all-values.yaml"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Tools:
    helm: str
    kubeconform: str
    kubectl: str
    keda_crd: Path


@dataclass(frozen=True)
class Render:
    text: str
    objects: list[Obj]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def named(self, kind: str, name: str) -> Obj:
        [found] = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        return found


def run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args[:3])}… exit {proc.returncode}: {proc.stderr}")
    return proc


def find_tools() -> Tools:
    lib = run(
        "bash",
        "-c",
        'source scripts/lib.sh && printf "%s\\n" "$HELM_BIN_DIR" "$KUBECONFORM_BIN_DIR" '
        '"$KEDA_CRD_DIR"',
    ).stdout.split()
    helm, kubeconform = f"{lib[0]}/helm", f"{lib[1]}/kubeconform"
    keda_crd = Path(lib[2]) / "keda.sh_scaledobjects.yaml"
    for path in (helm, kubeconform, keda_crd):
        if not Path(path).exists():
            pytest.fail(
                f"{path} is missing: run `scripts/setup.sh helm kubeconform keda-crds` "
                "(or `make setup`)",
                pytrace=False,
            )
    return Tools(helm, kubeconform, require_env("STACKFLOW_KUBECTL"), keda_crd)


def helm_template(tools: Tools, namespace: str, *args: str) -> Render:
    text = run(tools.helm, "template", "rel", str(CHART), "--namespace", namespace, *args).stdout
    return Render(text, [o for o in yaml.safe_load_all(text) if o])


def refused(tools: Tools, *args: str) -> str:
    """`helm template` with ``args`` fails: its stderr (stdout must be empty)."""
    proc = run(tools.helm, "template", "rel", str(CHART), *args, check=False)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout == "", proc.stdout
    return proc.stderr


# ---- RBAC ------------------------------------------------------------------------------------

READ_VERBS = frozenset({"get", "list", "watch"})


def rules_of(render: Render, kind: str, name: str, namespace: str | None = None) -> list[Obj]:
    """The rules of the (Cluster)Role a binding refers to, from the render; a role the chart
    does not render (an existing one) counts as granting everything."""
    for role in render.of_kind(kind):
        md = role["metadata"]
        if md["name"] == name and (namespace is None or md.get("namespace") == namespace):
            rules: list[Obj] = role["rules"]
            return rules
    return [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]


def granted(render: Render, binding: Obj) -> list[Obj]:
    ref = binding["roleRef"]
    namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
    return rules_of(render, ref["kind"], ref["name"], namespace)


def write_verbs(rules: Iterable[Obj]) -> set[str]:
    """Every verb of ``rules`` that is not a read (`*`, escalate, bind and impersonate
    included)."""
    return {verb for rule in rules for verb in rule["verbs"]} - READ_VERBS


# ---- NetworkPolicy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it: namespace, labels, address (namespace "": an address
    outside the cluster, which only ipBlock peers match)."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = "10.244.1.7"


def selects(selector: Obj, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector matches ``labels`` (`{}` matches everything)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: Obj, pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(pod.ip)
        nets = [ipaddress.ip_network(c) for c in block.get("except") or []]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(ip in n for n in nets)
    if not pod.namespace:
        return False
    if "namespaceSelector" in peer:
        ns_labels = {"kubernetes.io/metadata.name": pod.namespace}
        if not selects(peer["namespaceSelector"], ns_labels):
            return False
    elif pod.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, pod.labels)


def _port_matches(ports: list[Obj] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports
    )


def _allowed(
    policies: list[Obj], pod: Pod, direction: str, peer: Pod, port: int, proto: str
) -> bool:
    """Whether the policies selecting ``pod`` for ``direction`` (Ingress, Egress) let a
    connection with ``peer`` on ``port`` through (no such policy: everything passes)."""
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    relevant = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and direction in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], pod.labels)
    ]
    if not relevant:
        return True
    for policy in relevant:
        for rule in policy["spec"].get(rules_key) or []:
            if not _port_matches(rule.get("ports"), port, proto):
                continue
            peers = rule.get(peers_key)
            namespace = policy["metadata"]["namespace"]
            if not peers or any(_peer_matches(p, peer, namespace) for p in peers):
                return True
    return False


def connects(policies: list[Obj], src: Pod, dst: Pod, port: int, proto: str = "TCP") -> bool:
    """Whether NetworkPolicies (as the API defines them) let ``src`` open ``port`` on
    ``dst``: the source's egress and the destination's ingress both allow it."""
    return _allowed(policies, src, "Egress", dst, port, proto) and _allowed(
        policies, dst, "Ingress", src, port, proto
    )


def release_pods(render: Render, namespace: str) -> dict[str, Pod]:
    """The release's pods by component, with the labels of their Deployment's template."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: Pod(
            namespace, d["spec"]["template"]["metadata"]["labels"]
        )
        for d in render.of_kind("Deployment")
    }
