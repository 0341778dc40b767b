"""`stackflow worker`: run a worker in this process (as ``python -m stackflow.worker``)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from stackflow.cli.app import app


@app.command()
def worker(
    runtimes: Annotated[
        str | None,
        typer.Option(
            "--runtimes",
            help="What this worker serves: 'all' (default), or a comma list of main (workflows "
            "and bookkeeping), kubernetes, terraform, onprem, or a pinned queue such as "
            "onprem@dc1-* (STACKFLOW_RUNTIME_QUEUES onprem@<host glob>=<queue>); a list needs "
            "STACKFLOW_RUNTIME_QUEUES=on on every worker. Env: STACKFLOW_WORKER_RUNTIMES.",
        ),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option(
            "--metrics-address",
            envvar="STACKFLOW_METRICS_ADDRESS",
            help="Serve Prometheus metrics (the Temporal SDK's and stackflow's) at "
            "http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 (default: none; with --processes N, "
            "process i serves PORT+i).",
        ),
    ] = None,
    processes: Annotated[
        str | None,
        typer.Option(
            "--processes",
            help="Worker processes on this host, under this one (a number from 1 to 64, or "
            "'auto': one per CPU). One process runs Python on one core at a time; several "
            "share the runs' activities. Env: STACKFLOW_WORKER_PROCESSES. Default: 1.",
        ),
    ] = None,
) -> None:
    """Run a worker (as `python -m stackflow.worker`): TEMPORAL_ADDRESS, STACKFLOW_TASK_QUEUE, …"""
    import stackflow.worker.main as worker_module

    if metrics_address:  # the worker reads its settings from the environment
        os.environ["STACKFLOW_METRICS_ADDRESS"] = metrics_address

    worker_module.shell_main(runtimes, processes)
