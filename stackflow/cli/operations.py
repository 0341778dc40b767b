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

from stackflow.cli.api_mode import api_mode
from stackflow.cli.app import app
from stackflow.cli.output import OutputFormat
from stackflow.cli.policy import policy_fields, policy_requires_approval
from stackflow.cli.report import release_from_backend, report
from stackflow.cli.runs import RunPaused, current_user, namespace, ui_link
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.budget import BUDGET
from stackflow.model.release import Phase
from stackflow.model.spec import load_spec
from stackflow.temporal.operation import (
    OperationInput,
    OperationResult,
    check_request,
)

if TYPE_CHECKING:  # the Temporal SDK is imported only when a run goes to Temporal directly
    from stackflow.cli.runner import Runner


def build_request(stack: StackRef, **fields: Any) -> OperationInput:
    try:
        request = OperationInput(
            project=stack.project, workspace=stack.workspace, operator=current_user(), **fields
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {_option_error(exc)}") from None
    check_request(request)
    return request


def _option_error(exc: ValueError) -> str:
    """``field: message`` of the first validation error, in the CLI's option names."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        name = ".".join(str(p) for p in first["loc"]) or "input"
        option = "--" + name.replace("_", "-").removesuffix("-seconds")
        return f"{option}: {first['msg']}"
    return str(exc).splitlines()[-1].strip()


def spec_input(path: str) -> dict[str, Any]:
    """How the workflow input carries the spec: inline (``{"spec": …}``, all a client needs
    is Temporal), or, when it is over the byte budget even compressed and this machine
    shares the state backend (``STACKFLOW_STATE_URL`` set), stored there first and passed
    as ``{"spec_ref": …}``. Refused (exit 2) when it must go inline and is over Temporal's
    payload limit."""
    spec = load_spec(path)
    data = spec.model_dump(mode="json", by_alias=True)
    if api_mode():
        return {"spec": data}  # the API stores it first if it is over the byte budget
    from stackflow.temporal.codec import PAYLOAD_LIMIT, encoded_size

    size = asyncio.run(encoded_size(data))
    if size > BUDGET and os.environ.get("STACKFLOW_STATE_URL"):
        from stackflow.core.config import default_backend

        backend = default_backend()
        try:
            return {"spec_ref": backend.put_spec(spec)}
        finally:
            backend.close()
    if size > PAYLOAD_LIMIT * 0.95:
        raise SpecError(
            f"{path}: the spec is {size / 1048576:.1f} MiB compressed, over Temporal's "
            f"{PAYLOAD_LIMIT // 1048576} MiB payload limit: split it into several stacks, "
            "or set STACKFLOW_STATE_URL so the CLI stores it in the state backend first"
        )
    return {"spec": data}


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


def request_of(workflow: str, o: dict[str, Any]) -> OperationInput:
    """The workflow input of the run the options ``o`` describe (checked: exit 2 naming
    the option), the spec read and the run's own policy bundle stored first."""
    fields: dict[str, Any] = {}
    if workflow in ("PreviewWorkflow", "ApplyWorkflow"):
        fields.update(spec_input(o["file"]))
    if workflow in ("PreviewWorkflow", "ApplyWorkflow", "DestroyWorkflow"):
        fields.update(policy_fields(o.get("policy")))
    if workflow != "RefreshWorkflow" and workflow != "PreviewWorkflow":
        fields.update(max_concurrency=o["max_concurrency"], fail_fast=o["fail_fast"])
        fields["on_failure"] = o["on_failure"]
    if workflow in ("PreviewWorkflow", "ApplyWorkflow"):
        fields.update(ignore_fields=o["ignore_field"], force=o["force"], adopt=o["adopt"])
    if workflow == "ApplyWorkflow":
        fields["watch"] = o["watch"]
    if workflow == "RollbackWorkflow":
        fields["to_revision"] = o["to"]
    else:
        fields.update(targets=o["target"], excludes=o["exclude"])
    fields["unavailable_timeout_seconds"] = o["unavailable_timeout"]
    return build_request(StackRef(o["project"], o["workspace"]), **fields)


def check_options(workflow: str, o: dict[str, Any]) -> None:
    """Direct mode's checks of the options (and the spec), for a run through the API."""
    request_of(workflow, o)


def run_direct(workflow: str, o: dict[str, Any]) -> None:
    """The run to Temporal directly; ``--output ndjson`` prints its event stream instead of
    the preview, progress and result."""
    request = request_of(workflow, o)
    yes = bool(o.get("yes")) or workflow == "PreviewWorkflow"
    if o["output"] == "ndjson":
        asyncio.run(_run_ndjson(workflow, request, yes))
    else:
        output = OutputFormat(o["output"])
        asyncio.run(_run(workflow, request, output, yes, o["detail"], o.get("full", False)))


async def _run_ndjson(workflow: str, request: OperationInput, yes: bool) -> None:
    """Start the run and print its event stream until run_complete (approval comes from
    --yes or another command: `stackflow approve`); exit as the run's result says."""
    from stackflow.cli.events import ndjson_sink, stream_direct
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
