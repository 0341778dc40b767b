"""`stackflow preview|apply|destroy|worker`: commands that run through Temporal.

Each command sends the spec with the workflow input (compressed by the payload codec; it
needs nothing but Temporal) and starts the matching workflow with the stack's default id,
so a second concurrent run of the same stack is refused at once. Apply and destroy show the
preview, ask for approval (or take ``--yes``), send the approval as a workflow Update,
follow progress through the ``status`` query and print the resulting release.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stackflow.cli.app import app
from stackflow.cli.output import OutputFormat
from stackflow.cli.report import release_from_backend, report
from stackflow.cli.requests import request_of
from stackflow.cli.runs import RunPaused, namespace, policy_requires_approval, ui_link
from stackflow.model.release import Phase
from stackflow.temporal.operation import (
    OperationInput,
    OperationResult,
)

if TYPE_CHECKING:  # the Temporal SDK is imported only when a run goes to Temporal directly
    from stackflow.cli.runner import Runner


def _report(runner: Runner, result: OperationResult, run_id: str | None) -> None:
    link = ui_link(namespace(), runner.workflow_id, run_id)
    data = result.model_dump(mode="json")
    report(runner.output, runner.console, data, link, release_from_backend(result.stack))


async def _run(
    workflow: str,
    request: OperationInput,
    output: OutputFormat,
    yes: bool,
    detail: bool,
    full: bool = False,
) -> None:
    from stackflow.cli.runner import FINAL, PAUSED, Runner, full_changes

    if yes and workflow != "PreviewWorkflow":
        # Approved up front: the run goes from its preview straight to the walk (the release
        # records "<user> (auto_approve)"), one round trip less than an approval Update.
        request = request.model_copy(update={"auto_approve": True})
    runner = Runner(workflow, request, output)
    handle = await runner.start()
    if workflow == "PreviewWorkflow":
        result = await runner.result(handle)
        if full:
            result.changes = full_changes(result.changes)
        if output == OutputFormat.json:
            typer.echo(json.dumps(result.changes, indent=2, sort_keys=True))
        else:
            runner.show_preview(result.changes, detail)
        return
    status = await runner.wait_for(
        handle, {Phase.awaitingApproval, Phase.applying, Phase.destroying, PAUSED}
    )
    outcome = runner.outcome_of(handle)
    if outcome.done() and status.phase not in FINAL:
        # The run ended before it got anywhere (e.g. stack locked): report its error.
        _report(runner, await runner.result(handle), handle.result_run_id)
        return
    needs_person: str | None = None
    if status.phase not in FINAL or status.changes.get("changes"):
        preview = await runner.temporal.call(
            "the run", lambda: handle.query("preview", result_type=dict[str, Any])
        )
        runner.show_preview(preview, detail)
        needs_person = policy_requires_approval(preview)
    if status.phase == Phase.awaitingApproval:
        if yes and needs_person:
            # --yes approves for the requester; a policy asked for an approver instead.
            typer.echo(
                f"policy requires an approver: {needs_person}; waiting for `stackflow approve "
                f"-p {request.project} -w {request.workspace}`",
                err=True,
            )
        else:
            await runner.approve(handle, yes)
    await runner.follow(handle)
    if not runner.outcome_of(handle).done():
        paused = await runner.query_status(handle)
        if paused is not None and paused.phase == PAUSED:
            raise RunPaused(
                f"{request.stack} paused: {paused.failed} node(s) failed"
                + (f" ({paused.error})" if paused.error else "")
                + f"; re-run them with `stackflow retry -p {request.project} -w "
                f"{request.workspace}` or end the run with `stackflow abort -p "
                f"{request.project} -w {request.workspace}`"
            )
    result = await runner.result(handle)
    _report(runner, result, handle.result_run_id)


def run_direct(workflow: str, o: dict[str, Any]) -> None:
    """The run to Temporal directly; ``--output ndjson`` prints its event stream instead of
    the preview, progress and result."""
    request = request_of(workflow, o)
    yes = bool(o.get("yes")) or workflow == "PreviewWorkflow"
    if o["output"] == "ndjson":
        asyncio.run(_run_ndjson(workflow, request, yes))
    else:
        output = OutputFormat(o["output"])
        asyncio.run(
            _run(workflow, request, output, yes, o.get("detail", False), o.get("full", False))
        )


async def _run_ndjson(workflow: str, request: OperationInput, yes: bool) -> None:
    """Start the run and print its event stream until run_complete (approval comes from
    --yes or another command: `stackflow approve`); exit as the run's result says."""
    from stackflow.cli.event_lines import ndjson_sink
    from stackflow.cli.events import stream_direct
    from stackflow.cli.report import raise_failure
    from stackflow.cli.runner import Runner
    from stackflow.core.refs import RunRef

    if yes and workflow != "PreviewWorkflow":
        request = request.model_copy(update={"auto_approve": True})
    runner = Runner(workflow, request, OutputFormat.json)
    handle = await runner.start()
    run = RunRef(handle.id, handle.result_run_id or "")
    client = runner.temporal.client
    await stream_direct(client, request.stack, run, 0, True, ndjson_sink)
    raise_failure((await runner.result(handle)).model_dump(mode="json"))


@app.command()
def worker(
    runtimes: Annotated[
        str | None,
        typer.Option(
            "--runtimes",
            help="What this worker serves: 'all' (default), or a comma list of main (workflows "
            "and bookkeeping), kubernetes, terraform, onprem; a list needs "
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
