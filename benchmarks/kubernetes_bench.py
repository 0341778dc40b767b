"""Kubernetes, side by side: N ConfigMaps plus their Namespace, stackflow vs kubectl.

For each size, on the dev kube-apiserver of `make up` and the kubectl `make setup` built at
its version, each tool in a namespace of its own:

- apply: ``stackflow apply --yes`` (preview and approval included, as a user runs it) vs
  ``kubectl apply --server-side --validate=false`` of the same objects as one multi-document
  YAML (kubectl 1.30's default client-side validation step re-parses the OpenAPI document
  for every object, kubernetes/kubernetes#127095: ``--strict-peer`` times that too);
- unchanged preview: ``stackflow preview`` vs ``kubectl diff --server-side``;
- destroy: ``stackflow destroy --yes`` (foreground deletion, confirming each object is
  gone) vs ``kubectl delete --wait=false --ignore-not-found`` (background deletion, kubectl's
  default; the namespace controller may remove a ConfigMap before kubectl gets to it), vs that
  delete plus waiting until the namespace is gone (``kubectl wait --for=delete``), and,
  with ``--foreground-peer``, vs ``kubectl delete --cascade=foreground`` of the same objects in
  a third namespace, which waits as stackflow does (foreground deletions go at the pace of
  the controller manager's garbage collector, ~12 objects/s here).
  ``--propagation Background`` gives every object ``extensions.deletionPropagation``.

stackflow runs as a user runs it: the ``stackflow`` command against a worker process of the
benchmark's own (own task queue, home and SQLite state backend; see benchmarks/_lib). Per
phase it also counts the API server's requests on configmaps and namespaces (from its
``apiserver_request_total`` metric; other clients of the shared cluster add noise) and their
rate, the CPU of the `make up` services meanwhile (kube-apiserver, etcd, ...: their pids from
``STACKFLOW_RUN_DIR``, by default .run of this checkout; a worktree names the main one's) and,
for stackflow, the Temporal workflow and activity tasks of the runs. With ``--api`` the
``stackflow`` commands run in API mode, through a ``stackflow serve`` of the benchmark's own
on the same worker (as a team with the service runs them: the CLI then starts without the
Temporal SDK).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/kubernetes_bench.py                 # 1,000 ConfigMaps
    .venv/bin/python benchmarks/kubernetes_bench.py --sizes 100,1000 --repeat 2
    .venv/bin/python benchmarks/kubernetes_bench.py --api --repeat 3   # the CLI via the API
    .venv/bin/python benchmarks/kubernetes_bench.py --foreground-peer --strict-peer
    .venv/bin/python benchmarks/kubernetes_bench.py --propagation Background
    .venv/bin/python benchmarks/kubernetes_bench.py --profile /tmp/k8s.raw   # py-spy samples
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402
from benchmarks._lib.temporal_stats import RunStats, stack_stats  # noqa: E402

_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def manifests(namespace: str, size: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    ]
    for i in range(size):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"cm-{i:05d}",
                    "namespace": namespace,
                    "labels": {"app": "bench"},
                },
                "data": {"index": str(i), "greeting": f"hello from config map {i}"},
            }
        )
    return objects


def spec_for(objects: list[dict[str, Any]], propagation: str | None) -> dict[str, Any]:
    """The same objects as a stackflow spec; each ConfigMap depends on its Namespace."""
    resources: list[dict[str, Any]] = []
    ns_id = ""
    extensions = {"deletionPropagation": propagation} if propagation else {}
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == "Namespace":
            ns_id = f"v1:Namespace:{meta['name']}"
            resources.append({"id": ns_id, "type": "Kubernetes", "attributes": obj})
        else:
            resources.append(
                {
                    "id": f"v1:ConfigMap:{meta['namespace']}:{meta['name']}",
                    "type": "Kubernetes",
                    "attributes": obj,
                    "dependsOn": [ns_id],
                }
            )
        if extensions:
            resources[-1]["extensions"] = extensions
    return {"resources": resources}


def yaml_docs(objects: list[dict[str, Any]]) -> str:
    # JSON is YAML: one document per object
    return "".join(f"---\n{json.dumps(obj)}\n" for obj in objects)


def api_requests(kubectl: str) -> Counter[str]:
    """apiserver_request_total on configmaps and namespaces, by verb (dry runs apart)."""
    _, done = harness.timed([kubectl, "get", "--raw", "/metrics"])
    counts: Counter[str] = Counter()
    for line in done.stdout.splitlines():
        match = _METRIC.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        if labels.get("resource") not in ("configmaps", "namespaces"):
            continue
        verb = labels.get("verb", "?") + ("(dry)" if labels.get("dry_run") else "")
        counts[verb] += int(float(match.group("value")))
    return counts


def delta(before: Counter[str], after: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})


def describe(counts: Counter[str], size: int, seconds: float | None) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    rate = f", {total / seconds:.0f}/s" if seconds else ""
    return f"{total} ({total / (size + 1):.2f}/object{rate}: {parts})"


class Measured:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.requests: dict[str, Counter[str]] = {}
        self.temporal: dict[str, RunStats] = {}
        self.cpu: dict[str, str] = {}
        self.rss: dict[str, float | None] = {}  # the worker's peak RSS during each phase, MB


def measure(
    kubectl: str, measured: Measured, name: str, run: Any, *, count_requests: bool = True
) -> None:
    before = api_requests(kubectl) if count_requests else Counter()
    meter = harness.CpuMeter(harness.service_pids(harness.SERVICES))  # the peer's (stats: ours)
    meter.start()
    measured.seconds[name] = run()
    meter.stop()
    measured.cpu[name] = meter.describe(measured.seconds[name])
    if count_requests:
        measured.requests[name] = delta(before, api_requests(kubectl))


def bench_size(
    sf: harness.Stack,
    kubectl: str,
    size: int,
    concurrency: int | None,
    strict: bool,
    foreground: bool,
    propagation: str | None,
    prefix: str,
    no_peer: bool = False,
) -> tuple[Measured, Measured]:
    tag = uuid.uuid4().hex[:6]
    ours, peer = Measured(), Measured()
    sf_ns, kc_ns = f"{prefix}-sf-{tag}", f"{prefix}-kc-{tag}"
    project = f"k8sbench-{tag}"
    spec_path = sf.work / f"spec-{tag}.json"
    spec_path.write_text(json.dumps(spec_for(manifests(sf_ns, size), propagation)))
    docs = sf.work / f"objects-{tag}.yaml"
    docs.write_text(yaml_docs(manifests(kc_ns, size)))
    env = sf.env
    extra = ["--max-concurrency", str(concurrency)] if concurrency else []
    flags = ["--project", project]

    def stats(phase: str, since: float) -> None:
        ours.rss[phase] = sf.worker.phase_peak_rss_mb()
        if sf.meter is not None:
            ours.cpu[phase] = sf.meter.describe(ours.seconds[phase])
        ours.temporal[phase] = asyncio.run(
            stack_stats(f"stackflow/{project}/default", since, previews=phase == "preview")
        )

    # apply
    sf.worker.phase_peak_rss_mb()  # what came before is not the apply's
    t0 = time.time()
    measure(
        kubectl,
        ours,
        "apply",
        lambda: sf.cli("apply", "-f", str(spec_path), *flags, "--yes", *extra),
    )
    stats("apply", t0)
    # --validate=false: kubectl 1.30 re-parses the OpenAPI v3 document for every object when it
    # validates (kubernetes/kubernetes#127095, ~35 ms of client CPU per object here), which
    # would make the peer look slow for a reason of its own; stackflow asks for no validation
    # either (the server's default for apply patches applies).
    if no_peer:  # stackflow alone: its unchanged preview and destroy, no kubectl
        for phase, args in (
            ("preview", ["preview", "-f", str(spec_path)]),
            ("destroy", ["destroy", "--yes", *extra]),
        ):
            t0 = time.time()
            measure(kubectl, ours, phase, functools.partial(sf.cli, *args, *flags))
            stats(phase, t0)
        return ours, peer
    measure(
        kubectl,
        peer,
        "apply",
        lambda: harness.timed(
            [kubectl, "apply", "--server-side", "--validate=false", "-f", str(docs)], env=env
        )[0],
    )
    if strict:
        strict_docs = sf.work / f"objects-{tag}-strict.yaml"
        strict_docs.write_text(yaml_docs(manifests(f"{kc_ns}-strict", size)))
        peer.seconds["apply-strict"] = harness.timed(
            [kubectl, "apply", "--server-side", "-f", str(strict_docs)], env=env
        )[0]
        harness.timed(
            [kubectl, "delete", "--wait=false", "--ignore-not-found", "-f", str(strict_docs)],
            env=env,
        )
    # unchanged preview: kubectl diff exits 0 when nothing would change, 1 when something would
    t0 = time.time()
    measure(kubectl, ours, "preview", lambda: sf.cli("preview", "-f", str(spec_path), *flags))
    stats("preview", t0)
    diffs: list[str] = []

    def kubectl_diff() -> float:
        seconds, done = harness.timed(
            [kubectl, "diff", "--server-side", "-f", str(docs)], env=env, ok_codes=(0, 1)
        )
        if done.returncode != 0:
            diffs.append(done.stdout[:500])
        return seconds

    measure(kubectl, peer, "preview", kubectl_diff)
    if diffs:
        print(f"warning: kubectl diff found differences:\n{diffs[0]}", file=sys.stderr)
    # destroy
    t0 = time.time()
    measure(kubectl, ours, "destroy", lambda: sf.cli("destroy", *flags, "--yes", *extra))
    stats("destroy", t0)
    gone = namespace_seconds(sf, project, sf_ns)
    if gone is not None:
        ours.seconds["destroy-ns"] = ours.seconds["destroy"] - gone
    measure(
        kubectl,
        peer,
        "destroy",
        lambda: harness.timed(
            [kubectl, "delete", "--wait=false", "--ignore-not-found", "-f", str(docs)], env=env
        )[0],
    )
    wait, _ = harness.timed(
        [kubectl, "wait", "--for=delete", f"namespace/{kc_ns}", "--timeout=600s"],
        env=env,
        ok_codes=(0, 1),  # 1: already gone before the wait started
    )
    peer.seconds["destroy+gone"] = peer.seconds["destroy"] + wait
    if foreground:
        # what stackflow confirms: each object deleted in the foreground and gone
        fg_docs = sf.work / f"objects-{tag}-fg.yaml"
        fg_docs.write_text(yaml_docs(manifests(f"{kc_ns}-fg", size)))
        harness.timed(
            [kubectl, "apply", "--server-side", "--validate=false", "-f", str(fg_docs)], env=env
        )
        peer.seconds["destroy-fg"] = harness.timed(
            [kubectl, "delete", "--cascade=foreground", "--timeout=600s", "-f", str(fg_docs)],
            env=env,
        )[0]
    return ours, peer


def namespace_seconds(sf: harness.Stack, project: str, namespace: str) -> float | None:
    """How long the destroy's Namespace node took (its DELETE, then the namespace controller
    emptying and removing it, ~5 s on this cluster whatever it holds): its
    ``apply_complete`` event's ``elapsed_seconds``, from ``stackflow events``."""
    done = subprocess.run(
        [harness.STACKFLOW, "events", "--project", project, "--output", "ndjson"],
        env=sf.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    wanted = f"v1:Namespace:{namespace}"
    for line in done.stdout.splitlines():
        event = json.loads(line)
        if (
            event.get("type") == "apply_complete"
            and (event.get("resource") or {}).get("id") == wanted
        ):
            return float(event["elapsed_seconds"])
    print(f"warning: no apply_complete for {wanted} in the destroy's events", file=sys.stderr)
    return None


def samples(size: int, ours: Measured, peer: Measured) -> list[harness.Sample]:
    """The run's rows: each phase of stackflow against each peer measured for it."""
    found = []
    for phase, peer_name, peer_key in (
        ("apply", "kubectl apply --server-side --validate=false", "apply"),
        ("apply", "  kubectl apply --server-side (validate=strict)", "apply-strict"),
        ("preview", "kubectl diff --server-side", "preview"),
        ("destroy", "kubectl delete --wait=false", "destroy"),
        ("destroy", "  … + wait until the namespace is gone", "destroy+gone"),
        ("destroy", "kubectl delete --cascade=foreground (waits)", "destroy-fg"),
    ):
        theirs = peer.seconds.get(peer_key)
        if theirs is not None:
            found.append(
                harness.Sample(
                    f"{phase} {size}", peer_name, ours.seconds.get(phase), theirs, count=size
                )
            )
    if not peer.seconds:  # --no-peer
        found = [
            harness.Sample(f"{p} {size}", "-", ours.seconds.get(p), None, count=size)
            for p in ("apply", "preview", "destroy")
        ]
    if "destroy-ns" in ours.seconds and "destroy" in peer.seconds:
        # the namespace controller's fixed time apart (the issue allows showing it separately)
        found.append(
            harness.Sample(
                f"destroy {size} w/o ns controller",
                "kubectl delete --wait=false",
                ours.seconds["destroy-ns"],
                peer.seconds["destroy"],
                count=size,
            )
        )
    return found


def report(size: int, ours: Measured, peer: Measured, run: int) -> list[harness.Sample]:
    found = samples(size, ours, peer)
    rows = [
        [
            s.work,
            harness.fmt_s(s.ours),
            f"{size / s.ours:.0f}" if s.ours else "-",
            s.peer,
            harness.fmt_s(s.theirs),
            harness.ratio(s.ours, s.theirs),
        ]
        for s in found
    ]
    print(f"\n== {size} ConfigMaps + Namespace, run {run}")
    print(
        harness.table(
            ["work", "stackflow s", "objects/s", "peer", "peer s", "stackflow/peer"], rows
        )
    )
    print("API server requests on configmaps+namespaces (other clients of the cluster add noise):")
    for phase in ("apply", "preview", "destroy"):
        for who, measured in (("stackflow", ours), ("kubectl  ", peer)):
            counts = measured.requests.get(phase, Counter())
            print(f"  {phase:<8} {who} {describe(counts, size, measured.seconds.get(phase))}")
        print(f"  {'':<8} kubectl's {peer.cpu.get(phase, '')}")
    peaks = [f"{phase} {mb:.0f} MB" for phase, mb in ours.rss.items() if mb]
    print("worker peak RSS in each phase: " + (", ".join(peaks) or "-"))
    print("Temporal, stackflow's runs of each phase:")
    for phase, stats in ours.temporal.items():
        print(f"  {phase:<8} {stats.describe(size + 1)}")
        print(f"  {'':<8} {ours.cpu.get(phase, '')}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1000"], help="e.g. 100,1000")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size")
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="passed to stackflow (CLI default)"
    )
    parser.add_argument("--backend", default="sqlite", help="sqlite (default) or postgresql")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw output file")
    parser.add_argument(
        "--strict-peer",
        action="store_true",
        help="also time kubectl apply with its default --validate=strict (slow in 1.30)",
    )
    parser.add_argument(
        "--foreground-peer",
        action="store_true",
        help="also time kubectl delete --cascade=foreground, which waits as stackflow does "
        "(over 3 minutes for 1,000 objects here)",
    )
    parser.add_argument(
        "--propagation",
        choices=["Foreground", "Background", "Orphan"],
        default=None,
        help="extensions.deletionPropagation of every object (default: none, i.e. Foreground)",
    )
    parser.add_argument(
        "--api",
        action="store_true",
        help="the CLI through a `stackflow serve` of the benchmark's own (API mode)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--namespace-prefix", default="bench", help="of every namespace made")
    parser.add_argument("--no-peer", action="store_true", help="stackflow alone (no kubectl)")
    args = parser.parse_args()
    harness.need_env("TEMPORAL_ADDRESS", "KUBECONFIG")
    kubectl = harness.tool("STACKFLOW_KUBECTL", "kubectl")
    server_log = harness.ServerLog()
    sizes = harness.sizes_arg(args.sizes)
    found: list[harness.Sample] = []
    with harness.stack(args.backend, profile=args.profile, keep=args.keep, api=args.api) as sf:
        mode = ", the CLI through the API" if args.api else ""
        print(
            f"stackflow worker pid {sf.worker.pid} (task queue {sf.queue}, {sf.backend}{mode}); "
            f"kubectl {kubectl}"
        )
        for size in sizes:
            for run in range(1, args.repeat + 1):
                ours, peer = bench_size(
                    sf,
                    kubectl,
                    size,
                    args.max_concurrency,
                    args.strict_peer,
                    args.foreground_peer,
                    args.propagation,
                    args.namespace_prefix,
                    args.no_peer,
                )
                found += report(size, ours, peer, run)
        peak = sf.worker.peak_rss_mb()
    if args.repeat > 1 or len(sizes) > 1:
        print(harness.summary(f"ConfigMaps + Namespace, {args.repeat} run(s) a size", found))
    print(f"\nworker peak RSS {peak:.0f} MB" if peak else "")
    print(server_log.report())


if __name__ == "__main__":
    main()
