"""A stack set's apply beside the same stacks applied by one CLI run each (issue 43):
``--stacks`` stacks of ``--files`` OnPrem files, applied

- as one set run (``stackflow set apply -f stacks.yaml --yes``, ``--max-parallel`` stacks at
  once), and
- by one ``stackflow apply --yes`` process per stack, all started at once,

on one worker of the benchmark's own; wall time of each, their ratio, and the set run's own
history (events, bytes: what it keeps per stack). The issue's figure is 100 stacks of 10
files; the default is smaller for a shared machine.

    eval "$(make -s env)"
    .venv/bin/python benchmarks/set_bench.py
    .venv/bin/python benchmarks/set_bench.py --stacks 100 --max-parallel 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402


def specs(root: Path, tag: str, stacks: int, files: int) -> list[tuple[str, Path]]:
    """(project, spec file) of each stack, its files under ``root``."""
    out = []
    root.mkdir(parents=True, exist_ok=True)
    for s in range(stacks):
        project = f"b{tag}s{s:03d}"
        resources = [
            {
                "id": f"onprem:File:{root / project / f'f{i}'}",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": str(root / project / f"f{i}"),
                    "content": f"{i}\n",
                },
            }
            for i in range(files)
        ]
        path = root / f"{project}.yaml"
        path.write_text(yaml.safe_dump({"resources": resources}))
        out.append((project, path))
    return out


async def history_size(env: dict[str, str], workflow_id: str) -> tuple[int, int]:
    from temporalio.client import Client

    from stackflow.temporal.codec import data_converter

    client = await Client.connect(
        env["TEMPORAL_ADDRESS"],
        namespace=env.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.events), sum(e.ByteSize() for e in history.events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=20)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--max-parallel", type=int, default=16)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stackflow-setbench-"))
    with harness.stack(onprem_root=root) as st:
        # the set run
        tag = uuid.uuid4().hex[:6]
        stacks = specs(root / "set", tag, args.stacks, args.files)
        set_file = root / "set" / "stacks.yaml"
        name = f"bench-{tag}"
        set_file.write_text(
            yaml.safe_dump(
                {"name": name, "stacks": [{"project": p, "spec": s.name} for p, s in stacks]}
            )
        )
        parallel = str(args.max_parallel)
        set_seconds = st.cli(
            "set", "apply", "-f", str(set_file), "--yes", "--max-parallel", parallel
        )
        events, size = asyncio.run(history_size(st.env, f"stackflow-set/{name}"))
        # one CLI run per stack, all at once
        tag = uuid.uuid4().hex[:6]
        stacks = specs(root / "cli", tag, args.stacks, args.files)
        started = time.perf_counter()
        procs = [
            subprocess.Popen(
                [harness.STACKFLOW, "apply", "-p", p, "-f", str(s), "--yes", "-o", "json"],
                env=st.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for p, s in stacks
        ]
        failed = [p.args for p in procs if p.wait(timeout=3600) != 0]
        cli_seconds = time.perf_counter() - started
        if failed:
            raise SystemExit(f"{len(failed)} CLI runs failed, e.g. {failed[0]!r}")
    rows = [
        ["one set run", f"{set_seconds:.1f}", f"{events} events, {size / 1024:.0f} KB"],
        [f"{args.stacks} CLI runs at once", f"{cli_seconds:.1f}", "-"],
    ]
    print(f"{args.stacks} stacks x {args.files} OnPrem files, cores {os.cpu_count()}")
    print(harness.table(["how", "wall s", "set run's history"], rows))
    print(f"set / CLI runs: {harness.ratio(set_seconds, cli_seconds)}")


if __name__ == "__main__":
    main()
