"""Terraform, side by side: N independent resources through stackflow vs one tofu root module.

Default: N=50 ``terraform_data`` (``--kind random_password`` for a real provider) applied,
planned unchanged and destroyed

- by stackflow as a user runs it: ``stackflow apply --yes`` / ``stackflow preview`` /
  ``stackflow destroy --yes`` against a worker process of the benchmark's own (own task queue,
  home and SQLite state backend; see benchmarks/_lib), one working directory per resource;
- the same commands in API mode (``STACKFLOW_API_URL``), through a ``stackflow serve`` of the
  benchmark's own on the same worker, on a second project;
- by stackflow as a service starts it: one Temporal client, connected once, starts the same
  three runs on a third project and waits for each result (the run alone, without the CLI
  process's start: Python and the Temporal SDK import in about 0.5 s, more than tofu's
  whole run of 50 ``terraform_data``);
- by ``tofu`` on one root module holding all N: ``apply -auto-approve -parallelism=10``,
  ``plan -parallelism=10`` (no changes), ``destroy -auto-approve -parallelism=10``, after a
  ``tofu init`` timed apart (not in the ratio);

- by ``tofu`` on the same root module, the commands stackflow makes it run for one batch
  (``plan -out`` + ``show -json`` + ``apply`` of that plan; ``plan -out``; ``apply
  -refresh-only`` + ``destroy -refresh=false``): the floor of stackflow's way (a preview shown
  exactly before anything changes, then applied as shown), each ratio to the peer printed
  and summed up as "tofu as stackflow runs it";

and prints wall times and stackflow/tofu ratios in one table. The same ``TF_CLI_CONFIG_FILE``
(offline mirror, plugin cache) serves both.

``--breakdown`` instead times the runtime's own steps per resource (init, plan + show -json,
apply; medians over ``-n`` resources) in three situations:

- cold: an empty plugin cache and a new working directory (the first resource of a
  provider on a new machine),
- warm cache: the plugin cache and its lock file are there, the working directory is new
  (a resource seen for the first time by a worker that has run others),
- warm workdir: the resource's working directory is initialised (the steady state).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/terraform_bench.py                     # 50 terraform_data
    .venv/bin/python benchmarks/terraform_bench.py --sizes 10,50 --repeat 2
    .venv/bin/python benchmarks/terraform_bench.py --kind random_password
    .venv/bin/python benchmarks/terraform_bench.py --breakdown -n 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402
from benchmarks._lib.temporal_stats import stack_stats  # noqa: E402
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions  # noqa: E402
from stackflow.runtimes.terraform import TerraformRuntime  # noqa: E402

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
        await wd.plan()
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


# ---- side by side -------------------------------------------------------------------------------
RANDOM_SOURCE = "hashicorp/random"
PARALLELISM = "10"


def stackflow_spec(kind: str, size: int) -> dict[str, Any]:
    resources = []
    for i in range(size):
        if kind == "terraform_data":
            rid = f"builtin:terraform:terraform_data:d{i}"
        else:
            rid = f"hashicorp:random:{kind}:d{i}"
        resources.append(
            {
                "id": rid,
                "type": "Terraform",
                "attributes": _attrs(kind, i, 0),
                "extensions": KINDS[kind],
            }
        )
    return {"resources": resources}


def _hcl(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_hcl(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def root_module(kind: str, size: int) -> str:
    """One root module holding the same N resources."""
    blocks = []
    if kind != "terraform_data":
        version = KINDS[kind]["provider"].rsplit("/", 1)[1]
        blocks.append(
            "terraform {\n  required_providers {\n"
            f'    random = {{ source = "{RANDOM_SOURCE}", version = "{version}" }}\n'
            "  }\n}\n"
        )
    for i in range(size):
        body = "\n".join(f"  {k} = {_hcl(v)}" for k, v in _attrs(kind, i, 0).items())
        blocks.append(f'resource "{kind}" "d{i}" {{\n{body}\n}}\n')
    return "\n".join(blocks)


def side_by_side(
    kind: str, size: int, run: int, backend: str, concurrency: int | None
) -> list[harness.Sample]:
    """One run of the three phases for ``size`` resources; its table printed, its rows
    (CLI and service, each against tofu) returned."""
    tofu = harness.tool("STACKFLOW_TF_BIN", "tofu")
    tag = uuid.uuid4().hex[:6]
    project = f"tfbench-{size}-{tag}"
    ours: dict[str, float] = {}
    via_api: dict[str, float] = {}
    served: dict[str, float] = {}
    theirs: dict[str, float] = {}
    extra = ["--max-concurrency", str(concurrency)] if concurrency else []
    with harness.stack(backend, api=True) as sf:
        spec = sf.work / "spec.json"
        spec.write_text(json.dumps(stackflow_spec(kind, size)))
        t0 = time.time()
        cpu = {}
        for way, project_of_way, times in (
            ("direct", project, ours),
            ("API", f"{project}-api", via_api),
        ):
            flags = ["--project", project_of_way]
            for phase, args in (
                ("apply", ("apply", "-f", str(spec), *flags, "--yes", *extra)),
                ("plan", ("preview", "-f", str(spec), *flags)),
                ("destroy", ("destroy", *flags, "--yes", *extra)),
            ):
                times[phase] = sf.cli(*args, api=way == "API")
                cpu[f"{phase} ({way})"] = sf.meter.describe(times[phase]) if sf.meter else ""
        stats = asyncio.run(stack_stats(f"stackflow/{project}/default", t0))
        service = harness.Service(sf)
        try:
            doc = stackflow_spec(kind, size)
            for phase, workflow, body in (
                ("apply", "ApplyWorkflow", doc),
                ("plan", "PreviewWorkflow", doc),
                ("destroy", "DestroyWorkflow", None),
            ):
                served[phase] = service.run(workflow, f"{project}-svc", body)
        finally:
            service.close()

        module = sf.work / "root"
        module.mkdir()
        (module / "main.tf").write_text(root_module(kind, size))
        env = {**sf.env, "TF_IN_AUTOMATION": "1", "TF_INPUT": "0"}
        init, _ = harness.timed([tofu, "init", "-input=false", "-no-color"], env=env, cwd=module)
        par = f"-parallelism={PARALLELISM}"
        theirs["apply"], _ = harness.timed(
            [tofu, "apply", "-auto-approve", "-input=false", "-no-color", par], env=env, cwd=module
        )
        theirs["plan"], _ = harness.timed(
            [tofu, "plan", "-input=false", "-no-color", "-detailed-exitcode", par],
            env=env,
            cwd=module,
        )
        theirs["destroy"], _ = harness.timed(
            [tofu, "destroy", "-auto-approve", "-input=false", "-no-color", par],
            env=env,
            cwd=module,
        )
        floor = design_floor(tofu, module, env)
    rows = [
        [
            f"{phase} {size}",
            harness.fmt_s(ours[phase]),
            harness.fmt_s(via_api[phase]),
            harness.fmt_s(served[phase]),
            f"tofu {phase}" + (" (-detailed-exitcode 0)" if phase == "plan" else ""),
            harness.fmt_s(theirs[phase]),
            harness.ratio(ours[phase], theirs[phase]),
            harness.ratio(via_api[phase], theirs[phase]),
            harness.ratio(served[phase], theirs[phase]),
        ]
        for phase in ("apply", "plan", "destroy")
    ]
    print(f"\n== {size} {kind}, run {run}: stackflow ({backend}) vs one tofu root module ({par})")
    print(
        harness.table(
            [
                "work",
                "CLI s",
                "CLI via API s",
                "service s",
                "peer",
                "tofu s",
                "CLI/tofu",
                "via API/tofu",
                "service/tofu",
            ],
            rows,
        )
    )
    print(
        "CLI: `stackflow apply --yes` / `preview` / `destroy --yes`, a new process each "
        "(direct: Temporal and the state backend; via API: through a `stackflow serve`); "
        "service: the same runs started by a connected Temporal client"
    )
    print(f"tofu init of the root module (not in the ratios): {init:.2f} s")
    print(
        "tofu's own commands as stackflow runs them (the same root module, one process each): "
        + "; ".join(
            f"{phase} {floor[phase]:.2f} s ({FLOOR_COMMANDS[phase]}), "
            f"{harness.ratio(floor[phase], theirs[phase])} of tofu {phase}; "
            f"the CLI via API {harness.ratio(via_api[phase], floor[phase])} of it"
            for phase in ("apply", "plan", "destroy")
        )
    )
    print(f"Temporal (apply + destroy runs): {stats.describe(size)}")
    for phase, text in cpu.items():
        print(f"  stackflow {phase}: {text}")
    return [
        harness.Sample(f"{phase} {size}, {way}", f"tofu {phase}", seconds[phase], theirs[phase])
        for phase in ("apply", "plan", "destroy")
        for way, seconds in (
            ("CLI", ours),
            ("CLI via API", via_api),
            ("service", served),
            ("tofu as stackflow runs it", floor),
        )
    ]


FLOOR_COMMANDS = {
    "apply": "plan -out, show -json, apply of the plan",
    "plan": "plan -out",
    "destroy": "apply -refresh-only, destroy -refresh=false",
}
"""What stackflow's runs make tofu do for a batch: an apply's preview plans to a file and
reads it (``show -json``: the exact diff shown before anything changes), its walk applies
that very plan; an unchanged preview's plan says it all; a destroy's preview refreshes
(the live objects it shows) and its walk destroys from that state."""


def design_floor(tofu: str, module: Path, env: dict[str, str]) -> dict[str, float]:
    """tofu's own time for the commands stackflow runs (:data:`FLOOR_COMMANDS`) on the same
    root module, from an empty state as the peer's apply: the least a stackflow run of one
    batch can take, before any of its own work (Temporal, the state backend, the CLI)."""
    flags = ["-input=false", "-no-color", "-json", f"-parallelism={PARALLELISM}"]
    plan = ["-out=stackflow.tfplan"]

    def run(*args: str) -> float:
        seconds, _ = harness.timed([tofu, *args], env=env, cwd=module)
        return seconds

    return {
        "apply": run("plan", *flags, *plan)
        + run("show", "-json", "-no-color", "stackflow.tfplan")
        + run("apply", *flags, "stackflow.tfplan"),
        "plan": run("plan", *flags, *plan),
        "destroy": run("apply", *flags, "-auto-approve", "-refresh-only")
        + run("destroy", *flags, "-auto-approve", "-refresh=false"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", nargs="+", default=["50"], help="e.g. 10,50")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size")
    parser.add_argument("--kind", choices=sorted(KINDS), default="terraform_data")
    parser.add_argument("--backend", default="sqlite", help="sqlite (default) or postgresql")
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="passed to stackflow (CLI default)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="time the runtime's steps per resource instead"
    )
    parser.add_argument("-n", type=int, default=5, help="--breakdown: resources per situation")
    args = parser.parse_args()
    if args.breakdown:
        asyncio.run(bench(args.n))
        return
    harness.need_env("TEMPORAL_ADDRESS", "TF_CLI_CONFIG_FILE")
    sizes = harness.sizes_arg(args.sizes)
    found: list[harness.Sample] = []
    for size in sizes:
        for run in range(1, args.repeat + 1):
            found += side_by_side(args.kind, size, run, args.backend, args.max_concurrency)
    if args.repeat > 1 or len(sizes) > 1:
        title = f"{args.kind}, {args.repeat} run(s) a size, vs one tofu root module"
        print(harness.summary(title, found))


if __name__ == "__main__":
    main()
    # The Temporal SDK's Rust core threads (the service client's) can abort the interpreter
    # while it finalizes, after the benchmark is done: leave as the CLI does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
