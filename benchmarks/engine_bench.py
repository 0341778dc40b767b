"""Engine benchmark: load, graph and preview diff of generated specs (1,000 and 10,000 resources).

Run: .venv/bin/python benchmarks/engine_bench.py [sizes...]
Pure CPU, no services. Prints one table of timings.
"""

from __future__ import annotations

import copy
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from stackflow.engine.diff import Preview, diff_resource
from stackflow.engine.graph import build_graph
from stackflow.engine.spec import parse_spec_text

CHAIN = 10  # resources depend on the previous one in chains of this length
FAN_IN_EVERY = 100  # every 100th resource depends on the 20 resources before it
REF_EVERY = 7  # every 7th resource references a dependency's live field via $kusion_path


def resource_id(i: int) -> str:
    return f"apps/v1:Deployment:ns{i % 20}:app-{i}"


def generate(n: int) -> dict[str, Any]:
    resources = []
    for i in range(n):
        deps: list[str] = []
        if i % CHAIN:
            deps.append(resource_id(i - 1))
        if i % FAN_IN_EVERY == 0 and i:
            deps.extend(resource_id(j) for j in range(i - 20, i) if j % CHAIN != CHAIN - 1)
        attrs: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": f"app-{i}",
                "namespace": f"ns{i % 20}",
                "labels": {"app.kubernetes.io/name": f"app-{i}", "tier": "web"},
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": f"app-{i}"}},
                "template": {
                    "metadata": {"labels": {"app": f"app-{i}"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": f"registry.example.com/app-{i}:1.0.0",
                                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                                "env": [{"name": "MODE", "value": "production"}],
                            }
                        ]
                    },
                },
            },
        }
        if i % REF_EVERY == 0 and i % CHAIN:
            attrs["metadata"]["annotations"] = {
                "upstream": f"$kusion_path.{resource_id(i - 1)}.metadata.uid"
            }
        resources.append(
            {"id": resource_id(i), "type": "Kubernetes", "attributes": attrs, "dependsOn": deps}
        )
    return {"resources": resources}


def live_of(attrs: dict[str, Any], i: int, rng: random.Random) -> dict[str, Any]:
    live = copy.deepcopy(attrs)
    live["metadata"].update({"uid": f"uid-{i}", "resourceVersion": str(i), "generation": 1})
    live["spec"]["progressDeadlineSeconds"] = 600
    live["status"] = {"replicas": 2, "readyReplicas": 2, "conditions": [{"type": "Available"}]}
    if rng.random() < 0.01:  # a few changes
        live["spec"]["replicas"] = 3
    return live


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Best of ``repeat`` runs, in ms (the machine is shared: the minimum is the signal)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, (time.perf_counter() - start) * 1000)
    return best, result


def row(table: Table, n: int, step: str, ms: float) -> None:
    table.add_row(f"{n:,}", step, f"{ms:,.1f}", f"{n / ms * 1000:,.0f}")


def run(n: int, table: Table) -> None:
    rng = random.Random(n)
    data = generate(n)
    text = yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)

    ms, spec = timed(lambda: parse_spec_text(text, "bench.yaml"))
    row(table, n, f"load YAML ({len(text) / 1e6:.1f} MB) -> validated Spec", ms)
    as_json = json.dumps(data)
    ms, _ = timed(lambda: parse_spec_text(as_json, "bench.json"))
    row(table, n, "load JSON -> validated Spec", ms)

    def graph() -> Any:
        g = build_graph(spec)
        return g, g.layers(), g.reverse_layers()

    ms, (g, layers, _) = timed(graph)
    row(table, n, f"build_graph + layers ({len(layers)} layers, {len(g.edges):,} edges)", ms)

    desired = {r.id: r.attributes for r in spec.resources}
    live = {rid: live_of(a, i, rng) for i, (rid, a) in enumerate(desired.items())}
    prior = dict(desired)

    def preview() -> Preview:
        return Preview(
            changes=[
                diff_resource(rid, "Kubernetes", desired[rid], live[rid], prior[rid])
                for rid in desired
            ]
        )

    ms, result = timed(preview)
    s = result.summary
    row(table, n, f"preview diff ({s['Update']} Update, {s['UnChanged']:,} UnChanged)", ms)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1_000, 10_000]
    table = Table(title="stackflow engine benchmark")
    table.add_column("Resources", justify="right")
    table.add_column("Step")
    table.add_column("ms", justify="right")
    table.add_column("resources/s", justify="right")
    for n in sizes:
        run(n, table)
    Console().print(table)


if __name__ == "__main__":
    main()
