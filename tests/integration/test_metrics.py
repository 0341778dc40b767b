"""Prometheus metrics (issue 24): a real worker process with STACKFLOW_METRICS_ADDRESS serves
the Temporal SDK's metrics and stackflow's at one endpoint; a preview and an apply of three
OnPrem files and a failing one move stackflow's counters by exactly what they did. The API's
client metrics reach its own ``/metrics`` through the SDK's buffer."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx

from stackflow.api.app import connect_temporal
from stackflow.api.metrics import Metrics, sdk_runtime
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    cli_json,
    expect_exit,
    file_resource,
    new_project,
    poll,
    write_spec,
)

Sample = tuple[str, frozenset[tuple[str, str]]]
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> dict[Sample, float]:
    """Prometheus text: each sample by (name, labels)."""
    samples: dict[Sample, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        samples[(name, frozenset(LABEL.findall(labels or "")))] = float(value)
    return samples


def sample(name: str, **labels: str) -> Sample:
    return (name, frozenset(labels.items()))


def stackflow_deltas(
    before: dict[Sample, float], after: dict[Sample, float]
) -> dict[Sample, float]:
    """What changed in stackflow's counters and histogram counts (not the seconds' sums)."""
    return {
        key: value - before.get(key, 0.0)
        for key, value in after.items()
        if key[0].startswith("stackflow_")
        and not key[0].endswith(("_sum", "_bucket"))
        and value != before.get(key, 0.0)
    }


async def _logged(worker: WorkerProcess, line: str) -> bool:
    return line in worker.log.read_text()


async def test_a_worker_serves_sdk_and_stackflow_metrics_with_exact_deltas(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    env = dict(stack_env)
    port = free_port()
    env["STACKFLOW_METRICS_ADDRESS"] = f"127.0.0.1:{port}"
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        await poll(
            lambda: _logged(worker, f"stackflow worker metrics: {url}"),
            timeout=5,
            what="the worker's metrics line",
        )
        before = parse(httpx.get(url, timeout=5).text)
        assert not any(name.startswith("stackflow_") for name, _ in before)  # nothing ran yet

        project = new_project()
        common = ("--project", project, "--output", "json")
        root = tmp_path / "site"
        root.mkdir()
        good = [file_resource(root / f"{n}.conf", f"{n}\n") for n in ("a", "b", "c")]
        (root / "taken").mkdir()  # a directory where the spec wants a file: Conflict
        clash = file_resource(root / "taken", "never\n")
        preview = write_spec(tmp_path / "good.yaml", good)
        expect_exit(run_cli(env, "preview", "-f", str(preview), *common))
        spec = write_spec(tmp_path / "apply.yaml", [*good, clash])
        began = time.monotonic()
        applied = cli_json(
            expect_exit(run_cli(env, "apply", "-f", str(spec), "--yes", *common), code=2)
        )
        apply_seconds = time.monotonic() - began
        assert sorted(r["status"] for r in applied["results"]) == ["failed"] + ["succeeded"] * 3

        def resources(action: str, outcome: str) -> Sample:
            return sample(
                "stackflow_resources_total",
                runtime="OnPrem",
                action=action,
                step="run_group",
                outcome=outcome,
            )

        wanted = {
            sample("stackflow_runs_total", operation="preview", outcome="succeeded"): 1.0,
            sample("stackflow_runs_total", operation="apply", outcome="failed"): 1.0,
            resources("Create", "succeeded"): 3.0,
            # something is at the clash's path already: an Update, which fails
            resources("Update", "failed"): 1.0,
            sample("stackflow_resource_seconds_count", runtime="OnPrem", action="Create"): 3.0,
            sample("stackflow_stack_lock_total", outcome="acquired"): 1.0,
        }

        async def settled() -> dict[Sample, float] | None:
            # the CLI may return a moment before the activity that ends the run records it
            now = parse(httpx.get(url, timeout=5).text)
            return now if stackflow_deltas(before, now) == wanted else None

        try:
            after = await poll(settled, timeout=10, what="stackflow's counters")
        except AssertionError:
            now = parse(httpx.get(url, timeout=5).text)
            assert stackflow_deltas(before, now) == wanted  # shows the difference
            raise

        # each resource took well under the whole apply (seconds, not milliseconds)
        took = after[sample("stackflow_resource_seconds_sum", runtime="OnPrem", action="Create")]
        assert 0 < took < 3 * apply_seconds

        # the SDK's own metrics, same endpoint, durations in seconds
        names = {name for name, _ in after}
        for name in (
            "temporal_activity_execution_latency_bucket",
            "temporal_activity_schedule_to_start_latency_bucket",
            "temporal_workflow_endtoend_latency_bucket",
            "temporal_workflow_completed",
            "temporal_request",
            "temporal_worker_task_slots_available",
        ):
            assert name in names, f"{name} missing from {sorted(names)}"
        group_latency = [
            dict(labels)
            for name, labels in after
            if name == "temporal_activity_execution_latency_count"
            and ("activity_type", "run_group") in labels
        ]
        assert group_latency and group_latency[0]["task_queue"] == env["STACKFLOW_TASK_QUEUE"]
        # a failed apply still completes its workflow (its result says failed): the SDK
        # counts it completed, stackflow_runs_total says how it ended
        completed = {
            dict(labels)["workflow_type"]: value
            for (name, labels), value in after.items()
            if name == "temporal_workflow_completed"
        }
        assert completed == {"PreviewWorkflow": 1.0, "ApplyWorkflow": 1.0}
        # no label names a project, a workspace, a run or a resource
        values = {value for _, labels in after for _, value in labels}
        assert not [v for v in values if project in v or str(tmp_path) in v or "onprem:" in v]
    finally:
        worker.stop()


async def test_the_api_endpoint_shows_its_temporal_client_metrics(temporal_address: str) -> None:
    runtime, buffer = sdk_runtime()
    client = await connect_temporal(runtime)
    await client.count_workflows('WorkflowType = "NoSuchWorkflow"')
    api = Metrics(buffer)
    samples = parse(api.render())
    counted = {
        dict(labels).get("operation")
        for name, labels in samples
        if name == "temporal_request" and samples[(name, labels)] >= 1
    }
    assert {"GetSystemInfo", "CountWorkflowExecutions"} <= counted
    assert any(name == "temporal_request_latency_count" for name, _ in samples)


def test_a_bad_metrics_address_stops_the_worker_with_one_line(stack_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = run_cli(stack_env, "worker", "--metrics-address", address, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"STACKFLOW_METRICS_ADDRESS='{address}': Failed starting Prometheus exporter: "
            "Address already in use (os error 98)"
        )
    ), proc.stderr
    assert "Traceback" not in proc.stderr
