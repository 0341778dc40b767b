"""Apply N OnPrem File resources through a real ApplyWorkflow and measure it.

Runs against the services of `make up` (TEMPORAL_ADDRESS, REDIS_URL, and
STACKFLOW_POSTGRES_URL for the PostgreSQL backend) with its own in-process worker, task queue
and temporary STACKFLOW_HOME, once per state backend: SQLite (embedded) and PostgreSQL (a
temporary database), so the two print side by side. For each size it prints
resources/second, wall time and the event-history size of the parent run and of its largest
BatchWorkflow child (event count and bytes of ``fetch_history()``), then whether the Temporal
server logged a history-size warning while the benchmark ran.

    eval "$(scripts/services.sh env)"
    .venv/bin/python benchmarks/apply_bench.py                 # 100, 1000 on both backends
    .venv/bin/python benchmarks/apply_bench.py --backends sqlite --sizes 10000
    .venv/bin/python benchmarks/apply_bench.py --sizes 100,1000,10000,30000
    .venv/bin/python benchmarks/apply_bench.py --sizes 100 1000 --max-concurrency 16

It also prints the largest payloads of the parent history: the ``prepare_operation`` result
(the plan), the largest ``preview_batch`` result and the largest payload of any event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from temporalio.api.history.v1 import History  # noqa: E402
from temporalio.client import Client, WorkflowHistory  # noqa: E402

from stackflow.engine.spec import parse_spec  # noqa: E402
from stackflow.temporal.codec import data_converter  # noqa: E402
from stackflow.temporal.operation import OperationInput, OperationResult  # noqa: E402

HISTORY_WARNINGS = ("history size exceeds", "history count exceeds", "blob size exceeds")


@dataclass
class HistorySize:
    workflow_id: str
    events: int
    bytes: int


@dataclass
class Payloads:
    plan: int = 0
    preview: int = 0
    largest: int = 0
    largest_what: str = "-"


@dataclass
class Run:
    size: int
    seconds: float
    phase: str
    parent: HistorySize
    largest_child: HistorySize | None
    children: int
    payloads: Payloads


def history_size(workflow_id: str, history: WorkflowHistory) -> HistorySize:
    return HistorySize(workflow_id, len(history.events), History(events=history.events).ByteSize())


def payload_sizes(history: WorkflowHistory) -> Payloads:
    """Bytes of the plan, of the largest preview batch result and of the largest payload."""
    sizes = Payloads()
    scheduled: dict[int, str] = {}
    for event in history.events:
        attrs = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled[event.event_id] = attrs.activity_type.name
        done = event.activity_task_completed_event_attributes
        if event.HasField("activity_task_completed_event_attributes"):
            size = done.result.ByteSize()
            name = scheduled.get(done.scheduled_event_id, "?")
            if name == "prepare_operation":
                sizes.plan = max(sizes.plan, size)
            elif name == "preview_batch":
                sizes.preview = max(sizes.preview, size)
        which = event.WhichOneof("attributes")
        size = getattr(event, which).ByteSize() if which else 0
        if which and size > sizes.largest:
            sizes.largest, sizes.largest_what = size, which.replace("_event_attributes", "")
    return sizes


def spec_for(root: Path, size: int) -> dict[str, object]:
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


async def run_one(client: Client, queue: str, files: Path, size: int, concurrency: int) -> Run:
    project = f"bench{size}-{uuid.uuid4().hex[:6]}"
    root = files / project
    spec = parse_spec(spec_for(root, size), source="bench")
    request = OperationInput(
        project=project,
        spec=spec.model_dump(mode="json", by_alias=True),
        auto_approve=True,
        max_concurrency=concurrency,
    )
    workflow_id = f"stackflow/{project}/default"
    started = time.monotonic()
    handle = await client.start_workflow(
        "ApplyWorkflow",
        request,
        id=workflow_id,
        task_queue=queue,
        result_type=OperationResult,
    )
    result = await handle.result()
    seconds = time.monotonic() - started
    written = sum(1 for _ in root.iterdir()) if root.exists() else 0
    ok = result.counts.get("succeeded", 0)
    if result.phase != "succeeded" or written != size or ok != size:
        raise SystemExit(
            f"{size}: phase {result.phase}, {ok} succeeded, {written} files: {result.error}"
        )
    parent_history = await handle.fetch_history()
    parent = history_size(workflow_id, parent_history)
    children: list[HistorySize] = []
    query = f'WorkflowId STARTS_WITH "{workflow_id}/r"'
    async for execution in client.list_workflows(query):
        child = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        children.append(history_size(execution.id, await child.fetch_history()))
    largest = max(children, key=lambda h: h.bytes, default=None)
    return Run(
        size, seconds, result.phase, parent, largest, len(children), payload_sizes(parent_history)
    )


def server_log() -> Path | None:
    path = Path(os.environ.get("STACKFLOW_RUN_DIR", REPO / ".run")) / "logs" / "temporal.log"
    return path if path.exists() else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["100", "1000"],
        help="sizes, space- or comma-separated (e.g. 100,1000,10000,30000)",
    )
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    parser.add_argument(
        "--backends", default="sqlite,postgresql", help="state backends, comma-separated"
    )
    args = parser.parse_args()
    sizes = [int(x) for part in args.sizes for x in part.split(",") if x]
    rates: dict[tuple[str, int], float] = {}
    for backend in [b for b in args.backends.split(",") if b]:
        rates.update(await bench_backend(backend, sizes, args.max_concurrency, args.keep))
    print("\nresources/s side by side:")
    names = [b for b in args.backends.split(",") if b]
    print(f"{'resources':>9} " + " ".join(f"{n:>12}" for n in names) + "   ratio")
    for size in sizes:
        values = [rates.get((n, size)) for n in names]
        shown = " ".join(f"{v:>12.1f}" if v else f"{'-':>12}" for v in values)
        ratio = (
            f"   {values[1] / values[0]:.2f}x ({names[1]}/{names[0]})"
            if len(values) == 2 and values[0] and values[1]
            else ""
        )
        print(f"{size:>9} {shown}{ratio}")


@contextlib.contextmanager
def state_url(backend: str, work: Path) -> Iterator[str]:
    """SQLite in the home, or a temporary database on STACKFLOW_POSTGRES_URL."""
    if backend == "sqlite":
        yield f"sqlite:///{work / 'home' / 'state.db'}"
        return
    import psycopg
    import sqlalchemy as sa

    base = os.environ.get("STACKFLOW_POSTGRES_URL")
    if not base:
        raise SystemExit('STACKFLOW_POSTGRES_URL is not set: eval "$(make -s env)" first')
    name = f"sf_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def bench_backend(
    backend: str, sizes: list[int], concurrency: int, keep: bool
) -> dict[tuple[str, int], float]:
    from stackflow.state.backend import open_backend

    rates: dict[tuple[str, int], float] = {}

    work = Path(tempfile.mkdtemp(prefix="stackflow-bench-"))
    os.environ["STACKFLOW_HOME"] = str(work / "home")
    with state_url(backend, work) as url:
        store = open_backend(url, migrate=True)
        try:
            await _bench(backend, store, work, sizes, concurrency, rates)
        finally:
            store.close()
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
    return rates


async def _bench(
    backend: str,
    store: Any,
    work: Path,
    sizes: list[int],
    concurrency: int,
    rates: dict[tuple[str, int], float],
) -> None:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    import stackflow.worker.main as worker_module

    log = server_log()
    log_start = log.stat().st_size if log else 0
    client = await Client.connect(
        os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
        namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
        data_converter=data_converter(),
    )
    activities = worker_module.build_activities(os.environ.get("REDIS_URL") or None, backend=store)
    worker = worker_module.build_worker(client, queue, activities)
    print(f"\n== {backend}: home {work}, task queue {queue}, max_concurrency {concurrency}")
    print(
        f"{'resources':>9} {'wall s':>8} {'res/s':>8} {'parent events':>13} {'parent KB':>10} "
        f"{'children':>8} {'max child ev':>12} {'max child KB':>12} "
        f"{'plan KB':>8} {'preview KB':>10} {'max payload KB':>14}"
    )
    try:
        async with worker:
            for size in sizes:
                run = await run_one(client, queue, work / "files", size, concurrency)
                rates[(backend, size)] = run.size / run.seconds
                child = run.largest_child
                print(
                    f"{run.size:>9} {run.seconds:>8.1f} {run.size / run.seconds:>8.1f} "
                    f"{run.parent.events:>13} {run.parent.bytes / 1024:>10.1f} "
                    f"{run.children:>8} {child.events if child else '-':>12} "
                    f"{f'{child.bytes / 1024:.1f}' if child else '-':>12} "
                    f"{run.payloads.plan / 1024:>8.1f} {run.payloads.preview / 1024:>10.1f} "
                    f"{run.payloads.largest / 1024:>14.1f} ({run.payloads.largest_what})",
                    flush=True,
                )
    finally:
        await activities.registry.close()
    if log is None:
        print("server log not found: cannot tell whether it warned about history size")
        return
    with log.open("rb") as fh:
        fh.seek(log_start)
        new = fh.read().decode(errors="replace")
    warned = [line for line in new.splitlines() if any(w in line.lower() for w in HISTORY_WARNINGS)]
    if warned:
        print(f"server logged {len(warned)} history/blob size warning(s), e.g.:")
        for line in warned[:3]:
            print("  " + line[:300])
    else:
        print(f"no history-size or blob-size warning in the server log ({log})")


if __name__ == "__main__":
    asyncio.run(main())
