"""SIGKILL the worker during a set run, twice: in the middle of a member's apply and during
the bake between two waves; new workers finish the same run, each stack applied once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Replayer

from stackflow.core.refs import StackRef
from stackflow.temporal.codec import data_converter
from stackflow.temporal.operation import StatusView, workflow_id_for
from stackflow.temporal.stack_set import SetView, set_workflow_id
from stackflow.workflows.catalog import ALL_WORKFLOWS
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import all_releases, file_resource, new_project, poll

FILES = 160
"""One at a time: the first stack is still applying when the worker dies."""


async def test_a_set_run_survives_its_worker_killed_mid_apply_and_mid_bake(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    temporal_client: Client,
) -> None:
    big, small = new_project(), new_project()
    root = tmp_path / "files"
    files = [file_resource(root / f"f{i:03d}", f"content {i}\n") for i in range(FILES)]
    name = f"crash-{big}"
    handle = await temporal_client.start_workflow(
        "SetWorkflow",
        {
            "name": name,
            "auto_approve": True,
            "max_concurrency": 1,
            "members": [
                {"project": big, "spec": {"resources": files}},
                {"project": small, "spec": {"resources": [file_resource(tmp_path / "s", "s\n")]}},
            ],
            "waves": [{"members": [0], "bake_seconds": 10}, {"members": [1]}],
        },
        id=set_workflow_id(name),
        task_queue=stack_env["STACKFLOW_TASK_QUEUE"],
        result_type=SetView,
    )
    member = temporal_client.get_workflow_handle(workflow_id_for(StackRef(big, "default")))

    async def some_done() -> StatusView | None:
        status = await member.query("status", result_type=StatusView)
        return status if status.phase == "applying" and status.done >= 10 else None

    await poll(some_done, timeout=90, what="10 files of the first stack applied")
    worker_process.kill()  # an activity of the member's apply is in flight
    assert len(list(root.iterdir())) < FILES, "the member must be cut in the middle"
    worker_process.start()

    async def baking() -> SetView | None:
        view = await handle.query("status", result_type=SetView)
        return view if view.phase == "baking" else None

    await poll(baking, timeout=180, what="the bake after wave 1")
    worker_process.kill()  # the bake's timer is running
    await asyncio.sleep(2)
    worker_process.start()
    view = await handle.result()
    assert view.phase == "succeeded", view.error
    assert sorted(p.name for p in root.iterdir()) == [f"f{i:03d}" for i in range(FILES)]
    for project in (big, small):  # each stack applied exactly once
        [release] = all_releases(stack_env, project)
        assert release.phase == "succeeded"
    [big_release] = all_releases(stack_env, big)
    assert len({r.id for r in big_release.state.resources}) == FILES
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=data_converter())
    replayed = await replayer.replay_workflow(
        await handle.fetch_history(), raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None, replayed.replay_failure
