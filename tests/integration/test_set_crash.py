"""SIGKILL the worker during a set run, twice: in the middle of a member's apply and during
the bake between two waves; new workers finish the same run, each stack applied once. And
Temporal itself SIGKILLed and started again during a bake (a dev server of the test's own, on
a db file, never the shared one): the run finishes, each stack applied once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Replayer

from stackflow.core.refs import StackRef
from stackflow.temporal.client import quiet_runtime
from stackflow.temporal.codec import data_converter
from stackflow.temporal.operation import StatusView, workflow_id_for
from stackflow.temporal.stack_set import SetView, set_workflow_id
from stackflow.workflows.catalog import ALL_WORKFLOWS
from tests.integration import test_cli_temporal_outage as outage
from tests.integration.conftest import WorkerProcess
from tests.integration.opshelp import all_releases, file_resource, new_project, poll
from tests.integration.test_cli_temporal_outage import DevServer

dev_server, own_env, own_worker = outage.dev_server, outage.own_env, outage.own_worker
"""The outage tests' fixtures: a Temporal dev server of the test's own, its env, its worker."""
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


BAKE = 15.0


async def test_a_set_run_survives_temporal_restarted_during_a_bake(
    tmp_path: Path, dev_server: DevServer, own_env: dict[str, str], own_worker: WorkerProcess
) -> None:
    first, second = f"s43-{new_project()}", f"s43-{new_project()}"
    name = f"s43-bake-{first}"

    async def connect() -> Client:
        return await Client.connect(
            dev_server.address, data_converter=data_converter(), runtime=quiet_runtime()
        )

    client = await connect()
    handle = await client.start_workflow(
        "SetWorkflow",
        {
            "name": name,
            "auto_approve": True,
            "members": [
                {"project": p, "spec": {"resources": [file_resource(tmp_path / p, f"{p}\n")]}}
                for p in (first, second)
            ],
            "waves": [{"members": [0], "bake_seconds": BAKE}, {"members": [1]}],
        },
        id=set_workflow_id(name),
        task_queue=own_env["STACKFLOW_TASK_QUEUE"],
        result_type=SetView,
    )

    async def baking() -> SetView | None:
        view = await handle.query("status", result_type=SetView)
        return view if view.phase == "baking" else None

    await poll(baking, timeout=120, what="the bake after wave 1")
    dev_server.kill()  # the bake's timer is running; the worker loses Temporal
    await asyncio.sleep(3)
    assert not (tmp_path / second).exists()
    await asyncio.to_thread(dev_server.start)  # same ports, same db file: history kept
    client = await connect()
    view = await client.get_workflow_handle(set_workflow_id(name), result_type=SetView).result()
    assert view.phase == "succeeded", view.error
    [one] = all_releases(own_env, first)
    [two] = all_releases(own_env, second)  # each stack applied exactly once
    assert one.phase == two.phase == "succeeded"
    waited = (two.created_at - one.modified_at).total_seconds()
    assert waited >= BAKE, f"wave 2 started {waited:.1f} s after wave 1 ended"
    assert (tmp_path / second).read_text() == f"{second}\n"
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=data_converter())
    history = await client.get_workflow_handle(set_workflow_id(name)).fetch_history()
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
