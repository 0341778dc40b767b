"""The policy gate, side by side: evaluating examples/policies (8 policies) on the plan of
N Kubernetes resources vs a real `stackflow preview` of the same resources.

N/2 ConfigMaps (an application.properties of ~1.5 KiB each) and N/2 Deployments (a full
manifest: labels, annotations, probes, resources, env, a volume; each depends on its
ConfigMap), all new, in a namespace of the dev kube-apiserver of `make up` (created with
kubectl first, so every object is previewed with its GET and server-side dry run, and
deleted afterwards). The objects obey every example policy, so every policy looks at every
resource and the previews succeed. Against a worker of the benchmark's own (own task queue,
home and SQLite state backend, see benchmarks/_lib), each measured ``--repeat`` times:

- policy: :func:`stackflow.policy_gate.engine.evaluate` in this process (the gate's
  engine: OPA started with restricted capabilities, the input written, the result read) on
  the input document of that plan, as ``stackflow policy eval`` prints it (the masked plan
  of a real preview: every object's manifest and its field-by-field diff);
- an empty policy: the same with one policy that looks at nothing (what starting OPA and
  reading the input cost on their own);
- preview: ``stackflow preview -f spec.json`` as a user runs it (CLI start included);
- preview --policy: the same with ``--policy examples/policies`` (the bundle stored, the
  input built and stored, the policies evaluated by the worker; the decision's own
  ``duration_ms``, OPA's part, is read from the JSON output);
- the ratios policy/preview and preview --policy/preview.

    eval "$(make -s env)"
    .venv/bin/python benchmarks/policy_bench.py                  # 1,000 resources, 3 runs
    .venv/bin/python benchmarks/policy_bench.py --size 5000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402

POLICIES = REPO / "examples" / "policies"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "shop",
        "app.kubernetes.io/managed-by": "stackflow",
        "team": "payments",
    }


def config_map(namespace: str, name: str, i: int) -> dict[str, Any]:
    properties = "\n".join(
        f"shop.{section}.{key}=value-{i}-{section}-{key}"
        for section in ("http", "db", "cache", "queue")
        for key in ("host", "port", "timeout", "pool", "retries", "user", "tls", "region")
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{name}-config",
            "namespace": namespace,
            "labels": labels(name),
            "annotations": {"shop.example.com/owner": "payments@example.com"},
        },
        "data": {
            "application.properties": properties,
            "LOG_LEVEL": "info",
            "FEATURE_FLAGS": "checkout-v2,fast-search,recommendations",
        },
    }


def deployment(namespace: str, name: str, i: int) -> dict[str, Any]:
    image = f"registry.example.com/shop/{name}:1.{i % 10}.{i % 7}"
    env: list[dict[str, Any]] = [
        {"name": f"SHOP_SETTING_{k}", "value": f"{i}-{k}"} for k in range(6)
    ]
    env.append(
        {
            "name": "LOG_LEVEL",
            "valueFrom": {"configMapKeyRef": {"name": f"{name}-config", "key": "LOG_LEVEL"}},
        }
    )
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels(name),
            "annotations": {"shop.example.com/owner": "payments@example.com"},
        },
        "spec": {
            "replicas": 2 + i % 5,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": labels(name),
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
                },
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                    "containers": [
                        {
                            "name": "app",
                            "image": image,
                            "ports": [
                                {"name": "http", "containerPort": 8080},
                                {"name": "metrics", "containerPort": 9090},
                            ],
                            "env": env,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"},
                            },
                            "readinessProbe": probe,
                            "livenessProbe": {**probe, "initialDelaySeconds": 15},
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/shop"}],
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
                },
            },
        },
    }


def spec_for(namespace: str, size: int) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for i in range(size // 2):
        name = f"app-{i:04d}"
        cm_id = f"v1:ConfigMap:{namespace}:{name}-config"
        resources.append(
            {"id": cm_id, "type": "Kubernetes", "attributes": config_map(namespace, name, i)}
        )
        resources.append(
            {
                "id": f"apps/v1:Deployment:{namespace}:{name}",
                "type": "Kubernetes",
                "attributes": deployment(namespace, name, i),
                "dependsOn": [cm_id],
            }
        )
    if size % 2:
        name = f"app-{size // 2:04d}"
        resources.append(
            {
                "id": f"v1:ConfigMap:{namespace}:{name}-config",
                "type": "Kubernetes",
                "attributes": config_map(namespace, name, size // 2),
            }
        )
    return {"resources": resources}


EMPTY = 'package stackflow\n\ndeny contains msg if {\n\tfalse\n\tmsg := "never"\n}\n'
"""A policy that looks at nothing: what OPA's start and reading the input cost alone."""


def evaluate_policies(
    document: dict[str, Any], *, empty: bool = False
) -> tuple[float, dict[str, int], int]:
    """The gate's engine on ``document`` with examples/policies (or one empty policy):
    (wall seconds, messages per rule, policies)."""
    from stackflow.policy_gate.bundle import load_bundle_dir
    from stackflow.policy_gate.engine import Module, evaluate
    from stackflow.policy_gate.plan_input import input_bytes

    if empty:
        modules = [Module(policy="run/empty.rego", source=EMPTY)]
    else:
        bundle = load_bundle_dir(POLICIES)
        modules = [Module(policy=f"run/{p}", source=s) for p, s in bundle.modules.items()]
    body = input_bytes(document)
    started = time.perf_counter()
    messages, policies = evaluate(modules, body)
    seconds = time.perf_counter() - started
    counts: dict[str, int] = {}
    for message in messages:
        counts[message.rule.value] = counts.get(message.rule.value, 0) + 1
    return seconds, counts, len(policies)


def stackflow_json(sf: harness.Stack, *args: str) -> tuple[float, Any]:
    """``stackflow ARGS`` printing JSON: (wall seconds, the document)."""
    seconds, done = harness.timed([harness.STACKFLOW, *args], env=sf.env, cwd=sf.work)
    return seconds, json.loads(done.stdout)


def ratio(ours: float, peer: float) -> str:
    """harness.ratio to three decimals: the policy is a small fraction of the preview."""
    return f"{ours / peer:.3f}x" if peer else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", type=int, default=1000, help="resources in the plan")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--backend", default="sqlite", help="sqlite (default) or postgresql")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    harness.need_env("TEMPORAL_ADDRESS", "KUBECONFIG")
    kubectl = harness.tool("STACKFLOW_KUBECTL", "kubectl")
    from stackflow.policy_gate.engine import find_opa

    tag = uuid.uuid4().hex[:6]
    namespace, project = f"bench-policy-{tag}", f"policybench-{tag}"
    spec = spec_for(namespace, args.size)
    harness.timed([kubectl, "create", "namespace", namespace])
    try:
        with harness.stack(args.backend, keep=args.keep) as sf:
            print(
                f"stackflow worker pid {sf.worker.pid} (task queue {sf.queue}, {sf.backend}); "
                f"OPA {find_opa()}; namespace {namespace}",
                flush=True,
            )
            spec_path = sf.work / "spec.json"
            spec_path.write_text(json.dumps(spec))
            flags = ["-f", str(spec_path), "--project", project]
            # the input document of the plan, from a real preview
            _, document = stackflow_json(sf, "policy", "eval", *flags)
            creates = document["summary"].get("Create", 0)
            if creates != args.size:
                raise SystemExit(f"the plan creates {creates} resources, not {args.size}")
            input_mb = len(json.dumps(document).encode()) / 1e6
            policy: list[float] = []
            baseline: list[float] = []
            preview: list[float] = []
            gated: list[float] = []
            engine_ms: list[float] = []
            counts: dict[str, int] = {}
            policies = 0
            for run in range(1, args.repeat + 1):
                seconds, counts, policies = evaluate_policies(document)
                policy.append(seconds)
                baseline.append(evaluate_policies(document, empty=True)[0])
                preview.append(sf.cli("preview", *flags))
                seconds, result = stackflow_json(
                    sf, "preview", *flags, "--policy", str(POLICIES), "--output", "json"
                )
                gated.append(seconds)
                decision = result.get("policy") or {}
                if decision.get("outcome") not in ("pass", "warn"):
                    raise SystemExit(f"the policies did not pass the plan: {decision}")
                if len(decision.get("policies") or []) != policies:
                    raise SystemExit(f"the worker evaluated other policies: {decision}")
                engine_ms.append(float(decision.get("duration_ms", 0)))
                print(
                    f"run {run}: policy {policy[-1]:.2f} s (an empty policy {baseline[-1]:.2f} s),"
                    f" preview {preview[-1]:.2f} s, preview --policy {gated[-1]:.2f} s"
                    f" (OPA in the worker {engine_ms[-1]:.0f} ms)",
                    flush=True,
                )
    finally:
        harness.timed([kubectl, "delete", "namespace", namespace, "--wait=false"])
    med = statistics.median
    print(
        f"\n== policy gate: {args.size} Kubernetes resources ({args.size // 2} Deployments, "
        f"{args.size - args.size // 2} ConfigMaps, all new), {policies} policies of "
        f"examples/policies, {args.repeat} runs each"
    )
    print(f"input document {input_mb:.1f} MB; messages {counts or 'none'}")
    print(
        harness.table(
            ["work", "median s", "min-max s", "vs preview"],
            [
                [
                    "policy evaluation (OPA, in process)",
                    harness.fmt_s(med(policy)),
                    harness.spread(policy),
                    ratio(med(policy), med(preview)),
                ],
                [
                    "  an empty policy (OPA start, input read)",
                    harness.fmt_s(med(baseline)),
                    harness.spread(baseline),
                    ratio(med(baseline), med(preview)),
                ],
                [
                    "stackflow preview",
                    harness.fmt_s(med(preview)),
                    harness.spread(preview),
                    "1.000x",
                ],
                [
                    "stackflow preview --policy examples/policies",
                    harness.fmt_s(med(gated)),
                    harness.spread(gated),
                    ratio(med(gated), med(preview)),
                ],
                [
                    "  its decision's duration_ms (OPA in the worker)",
                    harness.fmt_s(med(engine_ms) / 1000),
                    harness.spread([ms / 1000 for ms in engine_ms]),
                    ratio(med(engine_ms) / 1000, med(preview)),
                ],
            ],
        )
    )
    print(
        f"policy/preview = {med(policy) / med(preview):.3f} "
        f"(target: policy evaluation < 1 s: {'met' if med(policy) < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
