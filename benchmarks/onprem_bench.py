"""OnPrem, side by side: N files applied by `stackflow apply --yes` vs the OnPrem runtime
called directly in-process.

For each size: a new worker process of the benchmark's own (own task queue, home and
SQLite state backend, see benchmarks/_lib), warmed by one unmeasured 1-file apply, then

- stackflow: ``stackflow apply -f spec.json --yes`` end to end as a user sees it (CLI start,
  preview, approval, the walk, the release), resources/s;
- direct: ``OnPremRuntime().apply`` awaited once per file in this process (same files, another
  directory), right before stackflow's apply and again after the worker stopped, the faster
  of the two; and the same with the ``read`` and ``preview`` stackflow also makes per file;
- the ratio and stackflow's overhead per resource over the direct apply, in ms;
- the worker's peak RSS (``VmHWM``) over its life (one worker per size), the Temporal work
  counted from the runs' histories, and whether the Temporal server logged a history or
  payload size warning meanwhile.

    eval "$(make -s env)"
    .venv/bin/python benchmarks/onprem_bench.py                    # 1,000 files
    .venv/bin/python benchmarks/onprem_bench.py --sizes 10000      # peak RSS, size warnings
    .venv/bin/python benchmarks/onprem_bench.py --sizes 1000 --repeat 2 --backend postgresql
    .venv/bin/python benchmarks/onprem_bench.py --profile /tmp/onprem.raw    # py-spy samples

With ``--api`` the ``stackflow`` commands run in API mode, through a ``stackflow serve`` of
the benchmark's own on the same worker (as a team with the service runs them). With
``--worker-processes N`` the worker runs as N processes (``stackflow worker --processes N``);
its CPU and peak RSS are those of the N together.

After the one stack, the same number of files as ``--stacks`` (default 12) stacks applied at
once by as many ``stackflow apply`` processes on the same worker: their aggregate res/s,
and the single stack's res/s over it (at most 1.0x: the stacks together are no slower).

With ``--preview-destroy``, the one stack's unchanged ``stackflow preview`` and then its
``stackflow destroy --yes`` are timed too (ms a file, to compare sizes; the destroy must leave
no file), with the worker's peak RSS in each of the three phases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
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


def spec_for(root: Path, size: int) -> dict[str, Any]:
    return {
        "resources": [
            {
                "id": f"onprem:File:{root}/f{i:05d}.txt",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": f"{root}/f{i:05d}.txt",
                    "mode": "0644",
                    "content": f"resource {i}\n",
                },
            }
            for i in range(size)
        ]
    }


async def direct(spec: dict[str, Any], *, with_reads: bool) -> float:
    """The OnPrem runtime called in-process, one file after another; wall seconds."""
    from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
    from stackflow.runtimes.onprem import OnPremRuntime

    runtime = OnPremRuntime()
    options = RuntimeOptions(project="direct", workspace="default")
    requests = [
        ResourceRequest(id=r["id"], type="OnPrem", attributes=r["attributes"])
        for r in spec["resources"]
    ]
    started = time.perf_counter()
    for request in requests:
        if with_reads:
            await runtime.read(request, options)
            await runtime.preview(request, options)
        await runtime.apply(request, options)
    seconds = time.perf_counter() - started
    await runtime.close()
    return seconds


def many_stacks(
    sf: harness.Stack, files: Path, size: int, stacks: int, extra: list[str]
) -> tuple[float, str]:
    """``stacks`` projects of ``size // stacks`` files each, applied at once by as many
    ``stackflow apply --yes`` processes on the same worker; wall seconds until the last ends,
    and the CPU each part used meanwhile."""
    tag = uuid.uuid4().hex[:6]
    each = size // stacks
    procs: list[tuple[str, Path, subprocess.Popen[str]]] = []
    pids = harness.service_pids(harness.SERVICES)
    if sf.api is not None:
        pids["stackflow serve"] = sf.api.pid
    meter = harness.CpuMeter(pids, sf.worker.pids)
    meter.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    for n in range(stacks):
        project = f"onprembench-many-{n}-{tag}"
        spec_path = sf.work / f"spec-{n}.json"
        spec_path.write_text(json.dumps(spec_for(files / project, each)))
        command = [harness.STACKFLOW, "apply", "-f", str(spec_path), "--project", project]
        proc = subprocess.Popen(
            [*command, "--yes", *extra],
            env=sf.cli_env(),
            cwd=sf.work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append((project, files / project, proc))
    for project, root, proc in procs:
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"stackflow apply of {project} exited {proc.returncode}:\n{err}")
        written = sum(1 for _ in root.iterdir()) if root.exists() else 0
        if written != each:
            raise SystemExit(f"stackflow apply of {project} wrote {written} of {each} files")
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    meter.stop()
    meter.used[f"{stacks} stackflow CLIs"] = (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime
    )
    return seconds, meter.describe(seconds)


def then_preview_destroy(
    sf: harness.Stack, spec: Path, project: str, root: Path, size: int, extra: list[str]
) -> str:
    """The applied stack's unchanged preview, then its destroy, each timed (ms a file), and the
    worker's peak RSS in the apply before them and in each of them."""
    peaks = [sf.worker.phase_peak_rss_mb()]
    preview = sf.cli("preview", "-f", str(spec), "--project", project)
    peaks.append(sf.worker.phase_peak_rss_mb())
    destroy = sf.cli("destroy", "--project", project, "--yes", *extra)
    peaks.append(sf.worker.phase_peak_rss_mb())
    left = sum(1 for _ in root.iterdir()) if root.exists() else 0
    if left:
        raise SystemExit(f"stackflow destroy left {left} of {size} files")
    rss = ", ".join(
        f"{phase} {mb:.0f} MB"
        for phase, mb in zip(("apply", "preview", "destroy"), peaks, strict=True)
        if mb
    )
    return (
        f"unchanged preview {preview:.2f} s ({preview / size * 1000:.2f} ms a file), "
        f"destroy {destroy:.2f} s ({destroy / size * 1000:.2f} ms a file); "
        f"worker peak RSS: {rss or '-'}"
    )


def bench_size(
    size: int, args: argparse.Namespace, files: Path
) -> tuple[list[object], list[harness.Sample], str, str]:
    """One run for ``size`` files: its table row, its samples (stackflow against the direct
    calls; the stacks at once against the one stack), the Temporal work and the server log's
    size warnings."""
    tag = uuid.uuid4().hex[:6]
    project = f"onprembench-{size}-{tag}"
    server_log = harness.ServerLog()
    extra = ["--max-concurrency", str(args.max_concurrency)] if args.max_concurrency else []
    with harness.stack(
        args.backend,
        onprem_root=files,
        profile=args.profile,
        keep=args.keep,
        api=args.api,
        worker_processes=args.worker_processes,
    ) as sf:
        # warm: the worker's first run imports the workflows into its sandbox and the API
        # connects to Temporal (some 0.3-0.5 s once per process, which a user's long-lived
        # worker and API have paid long before): not part of any measured run
        warm = sf.work / "warm.json"
        warm.write_text(json.dumps(spec_for(files / f"warm-{tag}", 1)))
        sf.cli("apply", "-f", str(warm), "--project", f"onprembench-warm-{tag}", "--yes")
        root = files / project
        spec_path = sf.work / "spec.json"
        spec_path.write_text(json.dumps(spec_for(root, size)))
        # the direct peer right before (the worker idle) and again after the stack is
        # stopped: the faster of the two, so a load that changes between the two moments on
        # a shared machine does not favour stackflow
        os.environ["STACKFLOW_ONPREM_ROOTS"] = str(files)
        before = (
            asyncio.run(direct(spec_for(files / f"direct0-{tag}", size), with_reads=False))
            if args.direct
            else None
        )
        t0 = time.time()
        seconds = sf.cli("apply", "-f", str(spec_path), "--project", project, "--yes", *extra)
        written = sum(1 for _ in root.iterdir()) if root.exists() else 0
        if written != size:
            raise SystemExit(f"stackflow apply wrote {written} of {size} files")
        cpu = sf.meter.describe(seconds) if sf.meter else ""
        phases = (
            then_preview_destroy(sf, spec_path, project, root, size, extra)
            if args.preview_destroy
            else ""
        )
        many, many_cpu = (
            many_stacks(sf, files, size, args.stacks, extra) if args.stacks > 1 else (None, "")
        )
        peak = sf.worker.peak_rss_mb()
    stats = asyncio.run(stack_stats(f"stackflow/{project}/default", t0))
    # direct calls: the same files in another directory (the policy's roots allow it)
    plain: float | None = None
    reads: float | None = None
    if before is not None:
        plain = asyncio.run(direct(spec_for(files / f"direct-{tag}", size), with_reads=False))
        plain = min(plain, before)
        reads = asyncio.run(direct(spec_for(files / f"direct-reads-{tag}", size), with_reads=True))
    overhead = "-" if plain is None else f"{(seconds - plain) / size * 1000:.1f}"
    work = f"apply {size} files"
    found = (
        [
            harness.Sample(work, "direct apply", seconds, plain, count=size),
            harness.Sample(work, "direct read+preview+apply", seconds, reads, count=size),
        ]
        if plain is not None
        else []
    )
    row: list[object] = [
        size,
        harness.fmt_s(seconds),
        f"{size / seconds:.0f}",
        harness.fmt_s(plain),
        harness.fmt_s(reads),
        harness.ratio(seconds, plain),
        overhead,
        f"{peak:.0f}" if peak else "-",
    ]
    if many is not None:
        each = size // args.stacks * args.stacks
        row += [
            harness.fmt_s(many),
            f"{each / many:.0f}",
            harness.ratio(size / seconds, each / many),
        ]
        # seconds a file, as the table's one/aggregate res/s
        found.append(
            harness.Sample(
                f"{args.stacks} stacks at once, {each} files",
                f"one stack, {size} files (ratio per file)",
                many,
                seconds,
                count=each,
                ratio=(many / each) / (seconds / size),
            )
        )
    if many_cpu:
        cpu += f"\n  {args.stacks} stacks at once: {many_cpu}"
    if phases:
        cpu += f"\n  {phases}"
    return row, found, f"{stats.describe(size)}\n  {cpu}", server_log.report()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1000"], help="e.g. 1000,10000")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size")
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="passed to stackflow (CLI default)"
    )
    parser.add_argument("--backend", default="sqlite", help="sqlite (default) or postgresql")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw output file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument(
        "--stacks",
        type=int,
        default=12,
        help="then the same number of files as this many stacks applied at once (1: not)",
    )
    parser.add_argument(
        "--api",
        action="store_true",
        help="the CLI through a `stackflow serve` of the benchmark's own (API mode)",
    )
    parser.add_argument(
        "--no-direct",
        dest="direct",
        action="store_false",
        help="stackflow alone: no in-process runtime peer (a quicker look at large sizes)",
    )
    parser.add_argument(
        "--preview-destroy",
        action="store_true",
        help="then time the one stack's unchanged preview and its destroy",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=1,
        help="the worker as this many processes (`stackflow worker --processes N`)",
    )
    args = parser.parse_args()
    harness.need_env("TEMPORAL_ADDRESS")
    rows: list[list[object]] = []
    found: list[harness.Sample] = []
    notes: list[str] = []
    sizes = harness.sizes_arg(args.sizes)
    with tempfile.TemporaryDirectory(prefix="stackflow-onprem-bench-") as tmp:
        files = Path(tmp).resolve()
        for size in sizes:
            for run in range(1, args.repeat + 1):
                row, samples, temporal, warnings = bench_size(size, args, files)
                rows.append(row)
                found += samples
                notes.append(f"{size} files, run {run}: Temporal: {temporal}\n  {warnings}")
                print(
                    f"{size} files, run {run}: stackflow {row[1]} s, direct {row[3]} s", flush=True
                )
    mode = ", the CLI through the API" if args.api else ""
    if args.worker_processes > 1:
        mode += f", {args.worker_processes} worker processes"
    print(
        f"\n== OnPrem files: `stackflow apply --yes` ({args.backend}{mode}) vs the runtime "
        "in-process"
    )
    print(
        harness.table(
            [
                "files",
                "stackflow s",
                "res/s",
                "direct apply s",
                "direct read+preview+apply s",
                "stackflow/direct",
                "overhead ms/res",
                "worker peak RSS MB",
                *(
                    [f"{args.stacks} stacks at once s", "aggregate res/s", "one/aggregate"]
                    if args.stacks > 1
                    else []
                ),
            ],
            rows,
        )
    )
    for note in notes:
        print(note)
    if args.repeat > 1 or len(sizes) > 1:
        print(harness.summary(f"OnPrem files, {args.repeat} run(s) a size", found))


if __name__ == "__main__":
    main()
