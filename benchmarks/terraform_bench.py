"""Per-resource overhead of the Terraform runtime: init, plan (+ show -json), apply.

Three situations, each over N resources run one after another (medians, milliseconds):

- cold: an empty plugin cache and a new working directory (the first resource of a
  provider on a new machine),
- warm cache: the plugin cache and its lock file are there, the working directory is new
  (a resource seen for the first time by a worker that has run others),
- warm workdir: the resource's working directory is initialised (the steady state).

Run: ``eval "$(scripts/services.sh env)"; .venv/bin/python benchmarks/terraform_bench.py``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from runtimes.base import ResourceRequest, RuntimeOptions
from runtimes.terraform import TerraformRuntime

MIRROR = Path.home() / ".cache" / "stackflow" / "terraform" / "mirror"
KINDS: dict[str, dict[str, Any]] = {
    "random_password": {
        "provider": "registry.terraform.io/hashicorp/random/3.6.0",
        "resourceType": "random_password",
    },
    "terraform_data": {"provider": "terraform.io/builtin/terraform"},
}


def _attrs(kind: str, i: int, rev: int) -> dict[str, Any]:
    if kind == "random_password":
        return {"length": 12 + i, "keepers": {"rev": str(rev)}}
    return {"input": {"i": i, "rev": rev}}


async def _one(
    rt: TerraformRuntime, kind: str, i: int, options: RuntimeOptions, prior: dict[str, Any] | None
) -> tuple[dict[str, float], dict[str, Any]]:
    rev = 0 if prior is None else 1
    req = ResourceRequest(
        id=f"bench:{kind}:{kind}:r{i}",
        type="Terraform",
        attributes=_attrs(kind, i, rev),
        extensions=KINDS[kind],
        prior_state=prior,
    )
    times: dict[str, float] = {}
    async with rt._workdir(req, options) as wd:
        wd.seed(req.prior_state)
        t0 = time.perf_counter()
        await wd.ensure_init()
        times["init"] = time.perf_counter() - t0
        wd.write_config(with_resource=True)
        t0 = time.perf_counter()
        await rt._plan(wd)
        times["plan"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    live = await rt.apply(req, options)
    times["apply"] = time.perf_counter() - t0
    return times, live


def _report(label: str, samples: list[dict[str, float]]) -> None:
    cols = ("init", "plan", "apply")
    med = {c: statistics.median(s[c] for s in samples) * 1000 for c in cols}
    total = sum(med.values())
    print(
        f"  {label:<14} "
        + "  ".join(f"{c} {med[c]:7.0f}" for c in cols)
        + f"  total {total:7.0f}  (n={len(samples)})"
    )


async def bench(n: int) -> None:
    options = RuntimeOptions(project="bench", workspace="default", timeout_seconds=300)
    with tempfile.TemporaryDirectory(prefix="stackflow-tfbench-") as tmp:
        root = Path(tmp)
        for kind in KINDS:
            print(f"{kind} (ms, median of {n})")
            cold: list[dict[str, float]] = []
            for i in range(n):
                # a new plugin cache (and lock dir) per sample: every init is a cold one
                rc = root / f"cold-{kind}-{i}" / "tofurc"
                rc.parent.mkdir(parents=True)
                cache = rc.parent / "plugin-cache"
                cache.mkdir()
                rc.write_text(
                    f'plugin_cache_dir = "{cache}"\n'
                    "provider_installation {\n"
                    f'  filesystem_mirror {{\n    path = "{MIRROR}"\n'
                    '    include = ["*/*/*"]\n  }\n'
                    '  direct { exclude = ["*/*/*"] }\n}\n'
                )
                os.environ["TF_CLI_CONFIG_FILE"] = str(rc)
                rt = TerraformRuntime(root=rc.parent / "work")
                times, _ = await _one(rt, kind, i, options, None)
                cold.append(times)
            _report("cold", cold)

            # warm cache: one shared cache, already holding the provider and its lock file
            rt = TerraformRuntime(root=root / f"warm-{kind}")
            os.environ["TF_CLI_CONFIG_FILE"] = str(root / f"cold-{kind}-0" / "tofurc")
            warm: list[dict[str, float]] = []
            lives: list[dict[str, Any]] = []
            for i in range(n):
                times, live = await _one(rt, kind, i, options, None)
                warm.append(times)
                lives.append(live)
            _report("warm cache", warm)

            steady: list[dict[str, float]] = []
            for i in range(n):
                times, _ = await _one(rt, kind, i, options, lives[i])
                steady.append(times)
            _report("warm workdir", steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=5, help="resources per situation")
    args = parser.parse_args()
    asyncio.run(bench(args.n))


if __name__ == "__main__":
    main()
