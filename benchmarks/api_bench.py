"""The service API, side by side with a connected Temporal client: 50 runs started at once on
50 stacks through ``POST /v1/stacks/{p}/{w}/runs`` (one ``stackflow serve`` process, httpx),
and the same 50 starts through one Temporal client as a service embedding the SDK would
(``start_workflow`` with stackflow's data converter). Then the event stream: the delay from a
resource's apply returning on the worker (its ``apply_complete`` event's ``time``) to that
line reaching a client following ``…/events`` (one stream per run, all at once).

Prints start latency p50/p99 of each, their ratio, and the event delivery lag p50/p99
(target: under 1 s). One worker, one API process and the client on this machine.

With ``--followers N`` (issue 46, target 6) it measures the streams instead: ``--runs``
runs of ``--files`` files started at once, each followed by N / runs streams at once, half
of which disconnect once midway and resume with ``?after=`` the last seq they read. Every
stream's seqs must be each of its run's events once, in order (checked against a
``?wait=false`` read of the whole run). Printed: the delivery lag p50/p99 of every
``apply_complete``, and the API process's CPU seconds and RSS growth (from /proc) over it,
beside the same runs followed by one stream each (the peer, in the same run).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/api_bench.py                 # 50 runs of 5 files each
    .venv/bin/python benchmarks/api_bench.py --runs 20 --files 10
    .venv/bin/python benchmarks/api_bench.py --followers 200 --runs 10 --files 200 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from benchmarks._lib import harness  # noqa: E402

TOKEN = harness.API_TOKEN


def spec_for(root: Path, files: int) -> dict[str, Any]:
    return {
        "resources": [
            {
                "id": f"onprem:File:{root}/f{i:03d}.txt",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": f"{root}/f{i:03d}.txt",
                    "mode": "0644",
                    "content": f"resource {i}\n",
                },
            }
            for i in range(files)
        ]
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def follow(http: httpx.AsyncClient, status_url: str, lags: list[float]) -> dict[str, Any]:
    """Read a run's stream to its end; each apply_complete's delivery lag into ``lags``."""
    last: dict[str, Any] = {}
    async with http.stream("GET", status_url + "/events") as r:
        r.raise_for_status()
        first = True
        async for line in r.aiter_lines():
            if not line:
                continue
            if first:
                first = False
                continue
            event = json.loads(line)
            if event["type"] == "apply_complete":
                happened = datetime.fromisoformat(event["time"])
                lags.append((datetime.now(UTC) - happened).total_seconds())
            last = event
    return last


async def through_api(
    url: str, root: Path, runs: int, files: int
) -> tuple[list[float], list[float]]:
    """Start latency of each POST (all at once), then every run's stream followed to its end."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=runs * 2 + 8)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(60, read=600), limits=limits
    ) as http:
        project = f"bapi{uuid.uuid4().hex[:6]}"

        async def start(i: int) -> tuple[float, str]:
            body = {
                "operation": "apply",
                "spec": spec_for(root / f"api{i}", files),
                "auto_approve": True,
            }
            began = time.perf_counter()
            r = await http.post(f"/v1/stacks/{project}/w{i}/runs", json=body)
            took = time.perf_counter() - began
            if r.status_code != 201:
                raise SystemExit(f"start {i}: {r.status_code} {r.text}")
            return took, str(r.json()["status_url"])

        started = await asyncio.gather(*(start(i) for i in range(runs)))
        lags: list[float] = []
        ends = await asyncio.gather(*(follow(http, u, lags) for _, u in started))
        bad = [e for e in ends if e.get("type") != "run_complete" or e.get("status") != "succeeded"]
        if bad:
            raise SystemExit(f"{len(bad)} runs did not succeed: {bad[:2]}")
        return [t for t, _ in started], lags


async def through_temporal(
    env: dict[str, str], queue: str, root: Path, runs: int, files: int
) -> list[float]:
    from temporalio.client import Client

    from stackflow.temporal.codec import data_converter
    from stackflow.temporal.operation import OperationInput, OperationResult, workflow_id_for

    client = await Client.connect(
        env["TEMPORAL_ADDRESS"],
        namespace=env.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    project = f"btmp{uuid.uuid4().hex[:6]}"

    async def start(i: int) -> tuple[float, Any]:
        request = OperationInput(
            project=project,
            workspace=f"w{i}",
            spec=spec_for(root / f"tmp{i}", files),
            auto_approve=True,
            operator="bench",
        )
        began = time.perf_counter()
        handle = await client.start_workflow(
            "ApplyWorkflow",
            request,
            id=workflow_id_for(request.stack),
            task_queue=queue,
            result_type=OperationResult,
        )
        return time.perf_counter() - began, handle

    started = await asyncio.gather(*(start(i) for i in range(runs)))
    results = await asyncio.gather(*(h.result() for _, h in started))
    bad = [r for r in results if r.phase != "succeeded"]
    if bad:
        raise SystemExit(f"{len(bad)} runs did not succeed: {bad[0].error}")
    return [t for t, _ in started]


async def watch(
    http: httpx.AsyncClient, url: str, lags: list[float], stop_at: int | None
) -> list[int]:
    """One follower of a run: the seqs it read, in order; with ``stop_at``, it disconnects
    after that many events and resumes with ``?after=`` the last seq it read."""
    seqs: list[int] = []
    while True:
        after = f"?after={seqs[-1]}" if seqs else ""
        async with http.stream("GET", f"{url}/events{after}") as r:
            r.raise_for_status()
            lines = r.aiter_lines()
            await anext(lines)  # the header
            async for line in lines:
                if not line:
                    continue
                # {"seq":N,"type":"T","time":"…",…}: read without parsing the whole line (the
                # client's own CPU would be the lag measured, with 200 streams in one process)
                head = line[:120].split('"', 12)
                seqs.append(int(head[2].strip(":,")))
                if head[5] == "apply_complete":
                    happened = datetime.fromisoformat(head[9])
                    lags.append((datetime.now(UTC) - happened).total_seconds())
                if stop_at is not None and len(seqs) >= stop_at:
                    break
            else:
                return seqs
        stop_at = None


async def followed(
    url: str, root: Path, runs: int, files: int, followers: int, api_pid: int
) -> dict[str, float]:
    """``runs`` runs started at once, each followed by ``followers // runs`` streams (half
    of them disconnecting once); the lags and the API's CPU and RSS growth over it."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # idle connections dropped before the server's keep-alive (5 s) ends them: a resume on
    # one the server is closing at that moment fails without a response
    limits = httpx.Limits(max_connections=followers * 2 + runs + 8, keepalive_expiry=1.0)
    each = max(1, followers // runs)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(60, read=600), limits=limits
    ) as http:
        project = f"bfol{uuid.uuid4().hex[:6]}"
        cpu0 = harness.cpu_seconds(api_pid) or 0.0
        own0 = time.process_time()
        rss0 = harness._proc_kb(api_pid, "VmRSS") or 0
        began = time.perf_counter()
        urls = []
        for i in range(runs):
            body = {
                "operation": "apply",
                "spec": spec_for(root / f"{project}-{i}", files),
                "auto_approve": True,
            }
            r = await http.post(f"/v1/stacks/{project}/w{i}/runs", json=body)
            if r.status_code != 201:
                raise SystemExit(f"start {i}: {r.status_code} {r.text}")
            urls.append(str(r.json()["status_url"]))
        lags: list[float] = []
        streams = [
            watch(http, u, lags, files if n % 2 else None) for u in urls for n in range(each)
        ]
        seen = await asyncio.gather(*streams)
        wall = time.perf_counter() - began
        cpu = (harness.cpu_seconds(api_pid) or 0.0) - cpu0
        rss = ((harness._proc_kb(api_pid, "VmRSS") or 0) - rss0) / 1024
        own = time.process_time() - own0
        for n, u in enumerate(urls):
            r = await http.get(f"{u}/events?wait=false")
            every = [json.loads(line)["seq"] for line in r.text.splitlines()[1:] if line]
            for got in seen[n * each : (n + 1) * each]:
                if got != every:
                    raise SystemExit(f"run {n}: a follower read {len(got)} of {len(every)}")
        if len(lags) != len(seen) * files:
            raise SystemExit(f"{len(lags)} apply_complete read, not {len(seen) * files}")
    return {
        "wall": wall,
        "cpu": cpu,
        "rss": rss,
        "p50": pct(lags, 0.5),
        "p99": pct(lags, 0.99),
        "events": float(sum(len(s) for s in seen)),
        "client": own,
    }


def followers_main(args: argparse.Namespace, root: Path) -> None:
    rows: list[list[object]] = []
    samples: list[harness.Sample] = []
    env = {"STACKFLOW_API_MAX_STREAMS": str(args.followers * 2)}
    with harness.stack(args.backend, onprem_root=root, api=True, extra_env=env) as stack:
        assert stack.api is not None
        url, pid = stack.api.url, stack.api.pid
        asyncio.run(through_api(url, root / "warm", 1, 1))
        for n in range(1, args.repeat + 1):
            many = asyncio.run(
                followed(url, root / f"m{n}", args.runs, args.files, args.followers, pid)
            )
            one = asyncio.run(followed(url, root / f"o{n}", args.runs, args.files, args.runs, pid))
            for name, got in ((f"{args.followers} followers", many), ("1 follower a run", one)):
                rows.append(
                    [
                        n,
                        name,
                        f"{got['wall']:.1f}",
                        f"{got['events']:.0f}",
                        f"{got['p50']:.2f}",
                        f"{got['p99']:.2f}",
                        f"{got['cpu']:.2f}",
                        f"{got['rss']:+.0f}",
                        f"{got['client']:.1f}",
                    ]
                )
            samples.append(harness.Sample("API CPU s", "1 follower a run", many["cpu"], one["cpu"]))
            samples.append(
                harness.Sample(
                    "apply_complete lag p99 s", "1 follower a run", many["p99"], one["p99"]
                )
            )
            print(f"run {n}: {rows[-2]} / {rows[-1]}", flush=True)
    print(f"\n== {args.runs} runs of {args.files} files, followed at once ({args.backend})")
    print(
        harness.table(
            [
                "run",
                "followers",
                "wall s",
                "events read",
                "lag p50 s",
                "lag p99 s",
                "API CPU s",
                "API RSS MB",
                "client CPU s",
            ],
            rows,
        )
    )
    print(harness.summary(f"{args.followers} followers", samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--followers", type=int, default=0, help="streams over the runs")
    parser.add_argument("--repeat", type=int, default=1, help="--followers: times")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stackflow-api-bench-"))
    if args.followers:
        followers_main(args, root)
        return
    with harness.stack(args.backend, onprem_root=root, api=True) as stack:
        assert stack.api is not None
        url = stack.api.url
        # warm both paths once (connections, imports, the worker's first run)
        asyncio.run(through_api(url, root / "warm", 1, 1))
        api_starts, lags = asyncio.run(through_api(url, root, args.runs, args.files))
        temporal_starts = asyncio.run(
            through_temporal(stack.env, stack.queue, root, args.runs, args.files)
        )
    rows = [
        [
            "start (API, HTTP)",
            harness.fmt_s(pct(api_starts, 0.5)),
            harness.fmt_s(pct(api_starts, 0.99)),
        ],
        [
            "start (Temporal client)",
            harness.fmt_s(pct(temporal_starts, 0.5)),
            harness.fmt_s(pct(temporal_starts, 0.99)),
        ],
        [
            "ratio API / Temporal",
            harness.ratio(pct(api_starts, 0.5), pct(temporal_starts, 0.5)),
            harness.ratio(pct(api_starts, 0.99), pct(temporal_starts, 0.99)),
        ],
        [
            f"event lag ({len(lags)} apply_complete)",
            harness.fmt_s(pct(lags, 0.5)),
            harness.fmt_s(pct(lags, 0.99)),
        ],
    ]
    print(
        f"{args.runs} runs at once on {args.runs} stacks, {args.files} files each ({args.backend})"
    )
    print(harness.table(["", "p50", "p99"], rows))


if __name__ == "__main__":
    main()
