"""The `stackflow` CLI's start, side by side (issue 25): the commands a person types most,
each run as a new process as a user runs it, beside a peer measured in the same run.

- ``stackflow --help`` beside ``kubectl --help`` and ``tofu -help`` (when found) and
  ``python -c pass``, the interpreter's own start (the floor of any Python CLI);
- ``stackflow status -p P`` in API mode (``STACKFLOW_API_URL``, as ``make env`` sets it) of
  a run waiting for approval, beside ``temporal workflow describe`` of the same workflow and
  ``kubectl get namespaces`` (a Go CLI's one round trip each), and the status's two requests
  from this warm process (the API's own time: what no CLI can go under);
- ``stackflow preview -f spec.yaml -p P`` of 10 OnPrem files end to end, in API mode (table,
  and ``-o json``) and direct (Temporal, ``STACKFLOW_API_URL`` unset: the ``make up``
  worker), beside ``tofu plan`` of one root module with 10 ``local_file`` resources and the
  preview's requests from this warm process (start, events to run_complete, the run, its
  changes: the API's and the worker's time).

Each command runs once unmeasured (its bytecode written) and then ``--runs`` times (default
5); the table has the median and the spread (min-max) of each, and stackflow's median over
the peer's. Nothing here is timed in a test.

    eval "$(make -s env)"
    .venv/bin/python benchmarks/cli_bench.py
    .venv/bin/python benchmarks/cli_bench.py --runs 9
    STACKFLOW_BENCH_CODE=/tmp/older .venv/bin/python benchmarks/cli_bench.py  # another tree's CLI
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._lib import harness  # noqa: E402

FILES = 10


class Row:
    """One measured command: its wall times, a short label, and the peers (labels) it is
    compared with."""

    def __init__(self, name: str, label: str, times: list[float], peers: Sequence[str]) -> None:
        self.name = name
        self.label = label
        self.times = times
        self.peers = list(peers)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def cells(self, by_label: dict[str, Row]) -> list[object]:
        spread = f"{min(self.times):.3f}-{max(self.times):.3f}"
        ratios = [
            f"{harness.ratio(self.median, by_label[p].median)} {p}"
            for p in self.peers
            if p in by_label
        ]
        return [self.name, self.label, f"{self.median:.3f}", spread, ", ".join(ratios) or "-"]


def cli_env(api: bool) -> dict[str, str]:
    """The environment a user's shell has after ``make env``: in API mode or, without
    ``api``, direct; bytecode written as usual (a first, unmeasured run writes it)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not api:
        env.pop("STACKFLOW_API_URL", None)
        env.pop("STACKFLOW_API_TOKEN", None)
    if harness.code_root() != REPO:
        env["PYTHONPATH"] = str(harness.code_root())  # ahead of the venv's editable install
    return env


def measure(
    cmd: Sequence[str],
    runs: int,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    ok: Sequence[int] = (0,),
) -> list[float]:
    harness.timed(cmd, env=env, cwd=cwd, ok_codes=ok)  # warm-up: caches, bytecode
    return [harness.timed(cmd, env=env, cwd=cwd, ok_codes=ok)[0] for _ in range(runs)]


def in_process(step: Callable[[], object], runs: int) -> list[float]:
    step()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def file_spec(root: Path, files: int) -> dict[str, Any]:
    return {
        "resources": [
            {
                "id": f"onprem:File:{root}/f{i:02d}.txt",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": f"{root}/f{i:02d}.txt",
                    "mode": "0644",
                    "content": f"file {i}\n",
                },
            }
            for i in range(files)
        ]
    }


def tofu_module(root: Path, files: int) -> str:
    blocks = [
        f'resource "local_file" "f{i:02d}" {{\n'
        f'  filename = "{root}/f{i:02d}.txt"\n  content  = "file {i}\\n"\n}}\n'
        for i in range(files)
    ]
    return "\n".join(blocks)


def found(env_name: str, name: str) -> str | None:
    return os.environ.get(env_name) or shutil.which(name)


# ---- the run status is measured on -------------------------------------------------------------
class WaitingRun:
    """An apply of one file through the API, waiting for approval (``stackflow apply -o
    ndjson``, which asks nobody), rejected at the end."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.env = env
        self.project = f"clibench{uuid.uuid4().hex[:8]}"
        spec = work / "waiting.json"
        spec.write_text(json.dumps(file_spec(work / "waiting", 1)))
        self.proc = subprocess.Popen(
            [harness.STACKFLOW, "apply", "-f", str(spec), "-p", self.project, "-o", "ndjson"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            done = subprocess.run(
                [harness.STACKFLOW, "status", "-p", self.project, "-o", "json"],
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode == 0 and json.loads(done.stdout)["phase"] == "awaitingApproval":
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise SystemExit(f"no run waiting for approval: {done.stderr[-2000:]}")
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run(
            [harness.STACKFLOW, "reject", "-p", self.project, "--reason", "benchmark"],
            env=self.env,
            capture_output=True,
        )
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def api_status_requests(project: str) -> Callable[[], object]:
    """The two requests `stackflow status` makes, from this process (one client)."""
    from stackflow.client import StackflowClient
    from stackflow.core.refs import StackRef

    client = StackflowClient.from_env()
    stack = StackRef(project, "default")

    def step() -> object:
        page = client.list_runs(stack, page_size=20)
        return client.get_run(stack, page.runs[0].run_id)

    return step


def api_preview_requests(project: str, spec: dict[str, Any]) -> Callable[[], object]:
    """The requests `stackflow preview` makes through the API, from this process."""
    from stackflow.client import StackflowClient
    from stackflow.core.refs import StackRef

    client = StackflowClient.from_env()
    stack = StackRef(project, "default")

    def step() -> object:
        created = client.start_run(stack, {"operation": "preview", "spec": spec})
        with client.events(stack, created.run_id) as stream:
            for _ in stream:
                pass
        view = client.get_run(stack, created.run_id)
        while view.status == "running":
            time.sleep(0.05)
            view = client.get_run(stack, created.run_id)
        return client.preview(stack, created.run_id)

    return step


# ---- main ---------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs of each command")
    parser.add_argument("--files", type=int, default=FILES, help="OnPrem files in the preview")
    args = parser.parse_args()
    harness.need_env("STACKFLOW_API_URL", "STACKFLOW_API_TOKEN", "TEMPORAL_ADDRESS")
    runs = args.runs
    api_env, direct_env = cli_env(api=True), cli_env(api=False)
    kubectl, tofu, temporal = (
        found("STACKFLOW_KUBECTL", "kubectl"),
        found("STACKFLOW_TF_BIN", "tofu"),
        shutil.which("temporal"),
    )
    load_before = os.getloadavg()
    rows: list[Row] = []

    def add(name: str, label: str, times: list[float], *peers: str) -> None:
        rows.append(Row(name, label, times, peers))
        print(f"{name}: median {statistics.median(times):.3f} s", flush=True)

    add("python -c pass", "python", measure([harness.PYTHON, "-c", "pass"], runs))
    if kubectl:
        add("kubectl --help", "kubectl", measure([kubectl, "--help"], runs))
    if tofu:
        add("tofu -help", "tofu", measure([tofu, "-help"], runs))
    add(
        "stackflow --help",
        "help",
        measure([harness.STACKFLOW, "--help"], runs, env=api_env),
        "python",
        "kubectl",
        "tofu",
    )

    with tempfile.TemporaryDirectory(prefix="stackflow-cli-bench-", dir="/tmp") as tmp:
        work = Path(tmp).resolve()
        waiting = WaitingRun(api_env, work)
        try:
            wid = f"stackflow/{waiting.project}/default"
            status = [harness.STACKFLOW, "status", "-p", waiting.project]
            add(
                "the status's 2 API requests, warm process",
                "api",
                in_process(api_status_requests(waiting.project), runs),
            )
            if temporal:
                add(
                    "temporal workflow describe",
                    "temporal",
                    measure([temporal, "workflow", "describe", "-w", wid], runs),
                )
            if kubectl and os.environ.get("KUBECONFIG"):
                add("kubectl get namespaces", "kubectl-get", measure([kubectl, "get", "ns"], runs))
            status_peers = ("python", "api", "temporal", "kubectl-get")
            add(
                "stackflow status (API)",
                "status",
                measure(status, runs, env=api_env),
                *status_peers,
            )
            add(
                "stackflow status -o json (API)",
                "status-json",
                measure([*status, "-o", "json"], runs, env=api_env),
                *status_peers,
            )
        finally:
            waiting.close()

        spec_doc = file_spec(work / "files", args.files)
        spec = work / "spec.json"
        spec.write_text(json.dumps(spec_doc))
        project = f"clibench{uuid.uuid4().hex[:8]}"
        preview = [harness.STACKFLOW, "preview", "-f", str(spec), "-p", project]
        n = args.files
        add(
            f"the preview's API requests, warm process ({n} files)",
            "api-preview",
            in_process(api_preview_requests(project, spec_doc), runs),
        )
        if tofu and os.environ.get("TF_CLI_CONFIG_FILE"):
            module = work / "tofu"
            module.mkdir()
            (module / "main.tf").write_text(tofu_module(work / "tofu-files", n))
            harness.timed([tofu, "init", "-input=false", "-no-color"], cwd=module)
            add(
                f"tofu plan ({n} local_file)",
                "tofu-plan",
                measure([tofu, "plan", "-input=false", "-no-color"], runs, cwd=module),
            )
        peers = ("api-preview", "tofu-plan")
        add(
            f"stackflow preview (API, {n} files)",
            "preview",
            measure(preview, runs, env=api_env),
            *peers,
        )
        add(
            f"stackflow preview -o json (API, {n} files)",
            "preview-json",
            measure([*preview, "-o", "json"], runs, env=api_env),
            *peers,
        )
        add(
            f"stackflow preview (direct, {n} files)",
            "preview-direct",
            measure(preview, runs, env=direct_env),
            *peers,
        )

    by_label = {row.label: row for row in rows}
    load_after = os.getloadavg()
    code = "this checkout" if harness.code_root() == REPO else str(harness.code_root())
    print(
        f"\n== the stackflow CLI's start ({code}), {runs} runs each after a warm-up; "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after"
    )
    print(
        harness.table(
            ["command", "label", "median s", "min-max s", "median / peer's median"],
            [row.cells(by_label) for row in rows],
        )
    )


if __name__ == "__main__":
    main()
