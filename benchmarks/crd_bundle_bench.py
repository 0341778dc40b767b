"""Kubernetes, side by side: a real cert-manager bundle (its six CRDs among ten objects),
stackflow vs kubectl, apply and destroy.

The manifests come from the cert-manager Go module (the Go module proxy, ``go mod download``,
cached under ~/.cache/stackflow/bench), its Helm chart rendered by the ``helm`` that
``make setup`` builds, with the CRDs: the Namespace, the six CustomResourceDefinitions, the
controller's ServiceAccount and Deployment, and a self-signed Issuer (a custom resource of
one of those CRDs). The CRDs are cluster-wide, so the two tools take turns:

- stackflow: ``stackflow apply --yes`` then ``stackflow destroy --yes`` (each object
  confirmed gone, a CRD only once the API server has removed it and its custom resources);
- kubectl: ``kubectl apply --server-side`` (CRDs first, then the rest once they are
  established: one file with both fails on the custom resource) then ``kubectl delete -f``
  of the same manifests (background propagation; kubectl waits until each object is gone,
  the Namespace too; ``--ignore-not-found``: a custom resource may go with its CRD first).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/crd_bundle_bench.py --api --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402

CACHE = Path.home() / ".cache" / "stackflow" / "bench"
CHART_OBJECTS = {
    ("ServiceAccount", "cert-manager"),
    ("Deployment", "cert-manager"),
}


def chart(version: str) -> Path:
    """The cert-manager chart of ``version`` with its CRDs among its templates, from the Go
    module proxy (the module holds the chart as a template and the CRDs beside it)."""
    root = CACHE / f"cert-manager-{version}"
    if (root / "Chart.yaml").exists():
        return root
    gopath = CACHE / "gopath"
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"github.com/cert-manager/cert-manager@{version}"],
        env={**os.environ, "GOPATH": str(gopath), "GOFLAGS": "-mod=mod"},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    module = Path(json.loads(done.stdout)["Dir"])
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(module / "deploy" / "charts" / "cert-manager", root)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for crd in (module / "deploy" / "crds").glob("crd-*.yaml"):
        shutil.copyfile(crd, root / "templates" / crd.name)
    text = (root / "Chart.template.yaml").read_text()
    text = text.replace("{{IS_PRERELEASE}}", "false").replace("v0.0.0", version)
    (root / "Chart.yaml").write_text(text)
    return root


def bundle(helm: str, version: str, namespace: str) -> list[dict[str, Any]]:
    command = [helm, "template", "cert-manager", str(chart(version)), "--namespace", namespace]
    rendered = subprocess.run(
        [*command, "--set", "crds.enabled=true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    crds, others = [], []
    for doc in yaml.safe_load_all(rendered):
        if not doc:
            continue
        if doc["kind"] == "CustomResourceDefinition":
            crds.append(doc)
        elif (doc["kind"], doc["metadata"]["name"]) in CHART_OBJECTS:
            doc["metadata"]["namespace"] = namespace
            others.append(doc)
    issuer = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": "selfsigned", "namespace": namespace},
        "spec": {"selfSigned": {}},
    }
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    objects = [ns, *crds, *others, issuer]
    assert len(objects) == 10 and len(crds) == 6, [o["kind"] for o in objects]
    return objects


def spec_for(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """A stackflow spec: namespaced objects after their Namespace (a custom resource comes
    after its CRD by itself)."""
    resources = []
    for obj in objects:
        meta = obj["metadata"]
        where = [meta["namespace"]] if "namespace" in meta else []
        rid = ":".join([obj["apiVersion"], obj["kind"], *where, meta["name"]])
        resource: dict[str, Any] = {"id": rid, "type": "Kubernetes", "attributes": obj}
        if where:
            resource["dependsOn"] = [f"v1:Namespace:{meta['namespace']}"]
        resources.append(resource)
    return {"resources": resources}


def elapsed(sf: harness.Stack, project: str) -> list[str]:
    """Where the last run's time went: each object's seconds (``apply_complete`` events)."""
    done = subprocess.run(
        [harness.STACKFLOW, "events", "--project", project, "--output", "ndjson"],
        env=sf.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = []
    for line in done.stdout.splitlines():
        event = json.loads(line)
        if event.get("type") == "apply_complete":
            kind_name = event["resource"]["id"].split(":", 1)[1]
            found.append((float(event["elapsed_seconds"]), kind_name))
    return [f"{name} {seconds:.1f}" for seconds, name in sorted(found, reverse=True)]


def docs(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text("".join(f"---\n{json.dumps(obj)}\n" for obj in objects))
    return path


def run_once(
    sf: harness.Stack, kubectl: str, helm: str, version: str, prefix: str
) -> list[harness.Sample]:
    tag = uuid.uuid4().hex[:6]
    project = f"crdbench-{tag}"
    ours = bundle(helm, version, f"{prefix}-sf-{tag}")
    spec = sf.work / f"spec-{tag}.json"
    spec.write_text(json.dumps(spec_for(ours)))
    sf_apply = sf.cli("apply", "-f", str(spec), "--project", project, "--yes")
    applied = elapsed(sf, project)
    sf_destroy = sf.cli("destroy", "--project", project, "--yes")
    destroyed = elapsed(sf, project)
    for phase, times in (("apply", applied), ("destroy", destroyed)):
        print(f"  stackflow {phase}, seconds per object: " + ", ".join(times), flush=True)
    theirs = bundle(helm, version, f"{prefix}-kc-{tag}")
    crds = [o for o in theirs if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in theirs if o["kind"] != "CustomResourceDefinition"]
    every = str(docs(sf.work / f"all-{tag}.yaml", theirs))

    def kubectl_run(*args: str, ok: tuple[int, ...] = (0,)) -> float:
        return harness.timed([kubectl, *args], env=sf.env, ok_codes=ok)[0]

    try:
        crd_file = str(docs(sf.work / f"crds-{tag}.yaml", crds))
        kc_apply = kubectl_run("apply", "--server-side", "-f", crd_file)
        kc_apply += kubectl_run("wait", "--for=condition=Established", "-f", crd_file)
        rest_file = str(docs(sf.work / f"rest-{tag}.yaml", rest))
        kc_apply += kubectl_run("apply", "--server-side", "-f", rest_file)
        kc_destroy = kubectl_run("delete", "--ignore-not-found", "--timeout=600s", "-f", every)
    finally:  # after a failure: nothing left for the next run's CRDs to collide with
        kubectl_run("delete", "--ignore-not-found", "--wait=false", "-f", every, ok=(0, 1))
    print(
        f"apply {sf_apply:.2f} s (kubectl {kc_apply:.2f} s), "
        f"destroy {sf_destroy:.2f} s (kubectl delete -f {kc_destroy:.2f} s)",
        flush=True,
    )
    return [
        harness.Sample("apply", "kubectl apply --server-side (CRDs, wait)", sf_apply, kc_apply),
        harness.Sample("destroy", "kubectl delete -f", sf_destroy, kc_destroy),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", default="v1.16.2", help="of cert-manager")
    parser.add_argument("--repeat", type=int, default=1, help="runs")
    parser.add_argument("--api", action="store_true", help="the CLI through the API")
    parser.add_argument("--namespace-prefix", default="bench", help="of every namespace made")
    args = parser.parse_args()
    harness.need_env("TEMPORAL_ADDRESS", "KUBECONFIG")
    kubectl = harness.tool("STACKFLOW_KUBECTL", "kubectl")
    helm = harness.tool("STACKFLOW_HELM", "helm")
    found: list[harness.Sample] = []
    with harness.stack(api=args.api) as sf:
        for _ in range(args.repeat):
            found += run_once(sf, kubectl, helm, args.version, args.namespace_prefix)
    print(harness.summary(f"cert-manager {args.version}, 10 objects", found))


if __name__ == "__main__":
    main()
