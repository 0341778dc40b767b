"""The fixed cost of one durable run (issue 46, target 4): a 1-file OnPrem ``stackflow apply
--yes`` through the API (``STACKFLOW_API_URL``, a ``stackflow serve`` of the benchmark's own),
CLI start to exit, one run after another, each on a new stack.

Per run: its wall time and the CPU seconds each process used meanwhile, read from /proc
(the worker, the API server, the Temporal server; the CLI from its rusage), summed over those
four; the other services' CPU is shown beside. The ``make up`` Temporal server counts
other sessions' work too: on a shared machine, start one of the benchmark's own and name it
(``STACKFLOW_BENCH_TEMPORAL_PID``, ``TEMPORAL_ADDRESS``).

Peers in the same run: the same 1-file apply started by a connected Temporal client and
waited for (the run alone, no CLI, no API; see ``harness.Service``), and ``python -c pass``
(the interpreter's start, the floor of any Python CLI).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/run_cost_bench.py                # 3 rounds of 10 runs
    .venv/bin/python benchmarks/run_cost_bench.py --runs 20 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402
from benchmarks.onprem_bench import spec_for  # noqa: E402

PARTS = ("worker", "temporal", "stackflow serve", "stackflow CLI")
"""The processes a run's CPU is counted over (the other services' are shown beside)."""


def round_of(sf: harness.Stack, files: Path, runs: int) -> tuple[list[float], dict[str, float]]:
    """``runs`` 1-file applies one after another; their wall seconds and the CPU seconds per
    run of each process (the median over the runs)."""
    walls: list[float] = []
    cpu: dict[str, list[float]] = {}
    tag = uuid.uuid4().hex[:6]
    for n in range(runs):
        project = f"runcost-{tag}-{n}"
        spec = sf.work / f"{project}.json"
        spec.write_text(json.dumps(spec_for(files / project, 1)))
        walls.append(sf.cli("apply", "-f", str(spec), "--project", project, "--yes"))
        if not (files / project / "f00000.txt").exists():
            raise SystemExit(f"{project}: the file was not written")
        assert sf.meter is not None
        for name, used in sf.meter.used.items():
            cpu.setdefault(name, []).append(used)
        for name in cpu:
            cpu[name] += [0.0] * (n + 1 - len(cpu[name]))
    return walls, {name: statistics.median(v) for name, v in cpu.items()}


def service_runs(sf: harness.Stack, files: Path, runs: int) -> list[float]:
    service = harness.Service(sf)
    try:
        tag = uuid.uuid4().hex[:6]
        return [
            service.run(
                "ApplyWorkflow", f"runcost-svc-{tag}-{n}", spec_for(files / f"svc-{tag}-{n}", 1)
            )
            for n in range(runs)
        ]
    finally:
        service.close()


def python_start(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([harness.PYTHON, "-c", "pass"], check=True)
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="sqlite", help="sqlite (default) or postgresql")
    args = parser.parse_args()
    harness.need_env("TEMPORAL_ADDRESS")
    samples: list[harness.Sample] = []
    cpu_rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="stackflow-runcost-") as tmp:
        files = Path(tmp).resolve()
        with harness.stack(args.backend, onprem_root=files, api=True) as sf:
            round_of(sf, files, 2)  # warm: the worker's and the API's first run, bytecode
            service_runs(sf, files, 1)
            for r in range(1, args.rounds + 1):
                walls, cpu = round_of(sf, files, args.runs)
                alone = service_runs(sf, files, args.runs)
                floor = python_start(args.runs)
                wall = statistics.median(walls)
                samples += [
                    harness.Sample(
                        "1-file apply, CLI via API", "the run alone", wall, statistics.median(alone)
                    ),
                    harness.Sample(
                        "1-file apply, CLI via API",
                        "python -c pass",
                        wall,
                        statistics.median(floor),
                    ),
                ]
                total = sum(v for n, v in cpu.items() if n in PARTS)
                parts = ", ".join(
                    f"{n} {s * 1000:.0f}" for n, s in sorted(cpu.items(), key=lambda kv: -kv[1])
                )
                cpu_rows.append(
                    [r, f"{wall:.3f}", f"{min(walls):.3f}-{max(walls):.3f}", f"{total:.3f}", parts]
                )
                print(
                    f"round {r}: wall {wall:.3f} s, CPU {total:.3f} s/run ({parts} ms)", flush=True
                )
    print(f"\n== 1-file OnPrem apply through the API, {args.runs} runs a round ({args.backend})")
    print(
        harness.table(
            ["round", "median s", "min-max s", "CPU s/run", "CPU ms/run by process (medians)"],
            cpu_rows,
        )
    )
    totals = [float(str(row[3])) for row in cpu_rows]
    print(
        f"CPU s/run over the rounds: median {statistics.median(totals):.3f} "
        f"({min(totals):.3f}-{max(totals):.3f})"
    )
    print(harness.summary("1-file apply", samples))


if __name__ == "__main__":
    main()
