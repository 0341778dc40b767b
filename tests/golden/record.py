"""Record the golden histories replayed by tests/unit/test_golden_replay.py.

    eval "$(make -s env)" && .venv/bin/python tests/golden/record.py

Runs each scenario against the dev services (`make up`) with an in-process worker and a
temporary SQLite state backend, and writes every run's history (children included) as
Temporal's JSON next to this file. Histories already committed are kept (they are what older
workers wrote; new scenarios are added beside them); `--rerecord` overwrites them. Re-record
only on purpose: a workflow change that makes a committed history fail to replay must be
versioned (workflow.patched) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from temporalio.client import Client, WorkflowHandle  # noqa: E402

import stackflow.worker.main as worker_module  # noqa: E402
from stackflow.engine.spec import parse_spec  # noqa: E402
from stackflow.policy_gate.bundle import PolicyBundle, store_bundle  # noqa: E402
from stackflow.state.backend import open_backend  # noqa: E402
from stackflow.temporal.codec import data_converter  # noqa: E402
from stackflow.temporal.operation import (  # noqa: E402
    ApprovalInput,
    DriftInput,
    DriftResult,
    OperationInput,
    OperationResult,
)


def files(root: Path, count: int, prefix: str = "f") -> list[dict[str, Any]]:
    return [
        {
            "id": f"onprem:File:{root}/{prefix}{i:03d}",
            "type": "OnPrem",
            "attributes": {"kind": "File", "path": f"{root}/{prefix}{i:03d}", "content": f"{i}\n"},
        }
        for i in range(count)
    ]


GATE = """package stackflow

import rego.v1

require_approval contains {"msg": "two files at once", "resource": "*"} if input.summary.Create > 1

warn contains sprintf("%s is new", [c.id]) if {
	some c in input.changes
	c.action == "Create"
}
"""
DENY = """package stackflow

import rego.v1

deny contains {"msg": "no files here", "resource": c.id} if some c in input.changes
"""

INDEX = HERE / "workflow_ids.json"
"""File name → workflow id (replay checks child ids against it)."""


RERECORD = "--rerecord" in sys.argv


async def save(
    client: Client, handle: WorkflowHandle[Any, Any], name: str, children: bool = True
) -> None:
    if (HERE / f"{name}.json").exists() and not RERECORD:
        return
    index = json.loads(INDEX.read_text()) if INDEX.exists() else {}
    history = await handle.fetch_history()
    (HERE / f"{name}.json").write_text(history.to_json())
    index[f"{name}.json"] = handle.id
    kids = [  # this run's own children (an apply and its destroy share a workflow id)
        event.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for event in history.events
        if event.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    for child_id in kids if children else []:
        sub = client.get_workflow_handle(child_id)
        suffix = child_id.rsplit("/", 1)[-1]
        (HERE / f"{name}.{suffix}.json").write_text((await sub.fetch_history()).to_json())
        index[f"{name}.{suffix}.json"] = child_id
    INDEX.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    print(f"recorded {name}")


async def main() -> None:
    # the histories are committed in the clear: the replay test has no key to read them with
    for name in ("STACKFLOW_ENCRYPTION_KEY", "STACKFLOW_ENCRYPTION_KEY_FILE"):
        os.environ.pop(name, None)
    work = Path(tempfile.mkdtemp(prefix="stackflow-golden-"))
    root = work / "files"
    backend = open_backend(f"sqlite:///{work / 'state.db'}")
    client = await Client.connect(
        os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"), data_converter=data_converter()
    )
    queue = f"golden-{uuid.uuid4().hex[:8]}"
    activities = worker_module.build_activities(None, backend=backend)
    tag = uuid.uuid4().hex[:6]

    async def start(project: str, **fields: Any) -> WorkflowHandle[Any, OperationResult]:
        return await client.start_workflow(
            fields.pop("workflow", "ApplyWorkflow"),
            OperationInput(project=project, **fields),
            id=f"stackflow/{project}/default",
            task_queue=queue,
            result_type=OperationResult,
        )

    async def phase(handle: WorkflowHandle[Any, Any], wanted: str) -> None:
        for _ in range(300):
            try:
                status = await handle.query("status")
                if status["phase"] == wanted:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.1)
        raise SystemExit(f"{handle.id} never reached {wanted}")

    async def preview(project: str, **fields: Any) -> WorkflowHandle[Any, OperationResult]:
        """A PreviewWorkflow of ``project``, once it has ended."""
        handle = await client.start_workflow(
            "PreviewWorkflow",
            OperationInput(project=project, **fields),
            id=f"stackflow/{project}/default/preview",
            task_queue=queue,
            result_type=OperationResult,
        )
        await handle.result()
        return handle

    async def apply_then_destroy(project: str, name: str, **fields: Any) -> None:
        """An apply of ``fields["spec"]`` saved as ``<name>_apply``, then a destroy of the
        stack (same concurrency) saved as ``<name>_destroy``."""
        concurrency = {k: v for k, v in fields.items() if k in ("max_concurrency", "batch_size")}
        applied = await start(project, auto_approve=True, **fields)
        await applied.result()
        await save(client, applied, f"{name}_apply")
        gone = await start(project, workflow="DestroyWorkflow", auto_approve=True, **concurrency)
        await gone.result()
        await save(client, gone, f"{name}_destroy")

    async with worker_module.build_worker(client, queue, activities):
        # approval wait, approved by Update
        approval = await start(f"golden-approve-{tag}", spec={"resources": files(root / "a", 3)})
        await phase(approval, "awaitingApproval")
        await approval.execute_update("approve", ApprovalInput(by="golden"))
        await approval.result()
        await save(client, approval, "approval_wait")

        # a large apply walked by BatchWorkflow children (batch_size 4)
        batched = await start(
            f"golden-batched-{tag}",
            spec={"resources": files(root / "b", 10)},
            auto_approve=True,
            batch_size=4,
        )
        await batched.result()
        await save(client, batched, "batched_apply")

        # a failed node: a file where a directory must be
        (root / "c").mkdir(parents=True)
        (root / "c" / "blocker").write_text("x\n")
        bad = files(root / "c" / "blocker", 1) + files(root / "c", 2, "ok")
        failed = await start(f"golden-failed-{tag}", spec={"resources": bad}, auto_approve=True)
        await failed.result()
        await save(client, failed, "failed_node")

        # pause on the failure, fix it, retry by Update
        (root / "d").mkdir(parents=True)
        (root / "d" / "blocker").write_text("x\n")
        paused = await start(
            f"golden-paused-{tag}",
            spec={"resources": files(root / "d" / "blocker", 1)},
            auto_approve=True,
            on_failure="pause",
        )
        await phase(paused, "awaitingDecision")
        (root / "d" / "blocker").unlink()
        await paused.execute_update("retry", ApprovalInput(by="golden"))
        await paused.result()
        await save(client, paused, "paused_retry")

        # destroy of the approved stack
        destroy = await start(
            f"golden-approve-{tag}", workflow="DestroyWorkflow", auto_approve=True
        )
        await destroy.result()
        await save(client, destroy, "destroy")

        # cancelled while awaiting approval
        cancelled = await start(f"golden-cancel-{tag}", spec={"resources": files(root / "e", 2)})
        await phase(cancelled, "awaitingApproval")
        await cancelled.cancel()
        with contextlib.suppress(Exception):  # it ends cancelled, as intended
            await cancelled.result()
        await save(client, cancelled, "cancelled")

        # rollback, drift check (drift found) and refresh of one stack
        verbs = f"golden-verbs-{tag}"
        one, two = files(root / "v", 2), files(root / "v", 3)
        two[0]["attributes"]["content"] = "changed\n"
        for spec in (one, two):
            await (await start(verbs, spec={"resources": spec}, auto_approve=True)).result()
        rollback = await start(verbs, workflow="RollbackWorkflow", to_revision=1, auto_approve=True)
        await rollback.result()
        await save(client, rollback, "rollback")
        (root / "v" / "f001").write_text("behind our back\n")
        drift = await client.start_workflow(
            "DriftWorkflow",
            DriftInput(project=verbs),
            id=f"stackflow/{verbs}/default/drift",
            task_queue=queue,
            result_type=DriftResult,
        )
        await drift.result()
        await save(client, drift, "drift")
        refresh = await start(verbs, workflow="RefreshWorkflow", auto_approve=True)
        await refresh.result()
        await save(client, refresh, "refresh")

        # ready nodes sharing run_group activities (a directory, then 12 files in it), and
        # a destroy of them in groups
        grouped_files = files(root / "g" / "dir", 12)
        for f in grouped_files:
            f["dependsOn"] = [f"onprem:Directory:{root}/g/dir"]
        directory = {
            "id": f"onprem:Directory:{root}/g/dir",
            "type": "OnPrem",
            "attributes": {"kind": "Directory", "path": f"{root}/g/dir"},
        }
        await apply_then_destroy(
            f"golden-grouped-{tag}",
            "grouped",
            spec={"resources": [directory, *grouped_files]},
            max_concurrency=4,
        )

        # Terraform nodes sharing run_group activities (one tofu command per group)
        data = [
            {
                "id": f"builtin:terraform:terraform_data:d{i}",
                "type": "Terraform",
                "attributes": {"input": {"i": i}},
                "extensions": {"provider": "terraform.io/builtin/terraform"},
            }
            for i in range(4)
        ]
        await apply_then_destroy(
            f"golden-tfgroup-{tag}", "grouped_terraform", spec={"resources": data}
        )
        # whole-terraform-groups: with a share of one call, a Terraform group still takes
        # every ready node (one tofu command), and groups hold one runtime each
        whole = [
            {**data[0], "id": f"builtin:terraform:terraform_data:w{i}", "attributes": {"input": i}}
            for i in range(12)
        ] + files(root / "w", 2)
        await apply_then_destroy(
            f"golden-tfwhole-{tag}", "whole_terraform", spec={"resources": whole}, max_concurrency=2
        )
        # whole-onprem-groups: with a share of one call, an OnPrem group takes up to 32
        # (ONPREM_GROUP_ROUNDS) ready nodes, one batch of its runtime: the 20 files in one
        await apply_then_destroy(
            f"golden-onpremwhole-{tag}",
            "whole_onprem",
            spec={"resources": files(root / "o", 20)},
            max_concurrency=2,
        )

        # the run-events patch: the change summary with the approval wait, the decision
        # wait of a paused run, and a preview's run_complete, appended by append_events
        announced = await start(f"golden-events-{tag}", spec={"resources": files(root / "x", 2)})
        await phase(announced, "awaitingApproval")
        await announced.execute_update("approve", ApprovalInput(by="golden"))
        await announced.result()
        await save(client, announced, "events_approval")
        (root / "y").mkdir(parents=True)
        (root / "y" / "blocker").write_text("x\n")
        decided = await start(
            f"golden-events-paused-{tag}",
            spec={"resources": files(root / "y" / "blocker", 1)},
            auto_approve=True,
            on_failure="pause",
        )
        await phase(decided, "awaitingDecision")
        await decided.execute_update("abort", ApprovalInput(by="golden"))
        await decided.result()
        await save(client, decided, "events_paused_abort")
        previewed = await preview(f"golden-events-{tag}", spec={"resources": files(root / "x", 3)})
        await save(client, previewed, "events_preview")
        # sliding-preview-window: six preview batches (1,001 files), four in flight, the
        # next started as each earlier one's result is taken (the spec goes by ref)
        wide = backend.put_spec(parse_spec({"resources": files(root / "s", 1001)}))
        slid = await preview(f"golden-slide-{tag}", spec_ref=wide)
        await save(client, slid, "sliding_preview")
        # the same preview as recorded before that patch: groups of four batches
        # (committed from the code before it; a re-record writes the sliding order)
        grouped_preview = await preview(f"golden-groups-{tag}", spec_ref=wide)
        await save(client, grouped_preview, "grouped_preview")
        # the policy gate: a pushed bundle asks for an approver despite auto_approve (and
        # warns); a run's own bundle denies an apply and a preview before anything changes
        gate = PolicyBundle(modules={"gate.rego": GATE})
        backend.bind_policy(f"golden-policy-{tag}", store_bundle(backend, gate), by="golden")
        asked = await start(
            f"golden-policy-{tag}", spec={"resources": files(root / "p", 2)}, auto_approve=True
        )
        await phase(asked, "awaitingApproval")
        await asked.execute_update("approve", ApprovalInput(by="golden"))
        await asked.result()
        await save(client, asked, "policy_approval")
        denying = store_bundle(backend, PolicyBundle(modules={"deny.rego": DENY}))
        denied = await start(
            f"golden-policy-denied-{tag}",
            spec={"resources": files(root / "q", 2)},
            auto_approve=True,
            policy_ref=denying,
        )
        await denied.result()
        await save(client, denied, "policy_denied")
        refused = await client.start_workflow(
            "PreviewWorkflow",
            OperationInput(
                project=f"golden-policy-denied-{tag}",
                spec={"resources": files(root / "q", 1)},
                policy_ref=denying,
            ),
            id=f"stackflow/golden-policy-denied-{tag}/default/preview",
            task_queue=queue,
            result_type=OperationResult,
        )
        with contextlib.suppress(Exception):
            await refused.result()
        await save(client, refused, "policy_preview_denied")

        # cancelled mid-walk: the groups in flight end, record what they applied, and only
        # then is the release closed (the settle-cancelled-nodes patch)
        walking = await start(
            f"golden-cancel-walk-{tag}",
            spec={"resources": files(root / "s", 400)},
            auto_approve=True,
            max_concurrency=1,
        )
        for _ in range(600):
            status = await walking.query("status")
            if status["phase"] == "applying" and status["done"] >= 16:
                break
            await asyncio.sleep(0.05)
        await walking.cancel()
        with contextlib.suppress(Exception):  # it ends cancelled, as intended
            await walking.result()
        await save(client, walking, "cancelled_mid_walk")

        # the phase written by local activities (the local-phase-writes patch): an apply,
        # and a run cancelled while awaiting approval (its closing write is local too)
        local = await start(
            f"golden-local-{tag}", spec={"resources": files(root / "l", 3)}, auto_approve=True
        )
        await local.result()
        await save(client, local, "local_phase_apply")
        closing = await start(
            f"golden-local-cancel-{tag}", spec={"resources": files(root / "m", 2)}
        )
        await phase(closing, "awaitingApproval")
        await closing.cancel()
        with contextlib.suppress(Exception):  # it ends cancelled, as intended
            await closing.result()
        await save(client, closing, "local_phase_cancelled")

        # the baseline: one patch marker a run; prepare_operation as a local activity. An
        # apply walked by BatchWorkflow children and its destroy, and an approval wait
        await apply_then_destroy(
            f"golden-baseline-{tag}",
            "baseline",
            spec={"resources": files(root / "z", 9)},
            batch_size=4,
        )
        waiting = await start(
            f"golden-baseline-wait-{tag}", spec={"resources": files(root / "t", 2)}
        )
        await phase(waiting, "awaitingApproval")
        await waiting.execute_update("approve", ApprovalInput(by="golden"))
        await waiting.result()
        await save(client, waiting, "baseline_approval")

        # grouping-from-plan (baseline-2026-11-29): the walk groups as the plan says
        # (OperationPlan.grouping, from each runtime's rules), in BatchWorkflow children too:
        # Terraform every ready node, OnPrem 32 a call of its share
        planned = [
            {**data[0], "id": f"builtin:terraform:terraform_data:g{i}", "attributes": {"input": i}}
            for i in range(12)
        ] + files(root / "g", 20)
        await apply_then_destroy(
            f"golden-plangroup-{tag}",
            "plan_grouping",
            spec={"resources": planned},
            max_concurrency=2,
            batch_size=16,
        )

        # stack sets (issue 43): a set previewed, approved once and applied, a $stack.
        # reference resolved between its members (the members' own runs are the ordinary
        # workflows above); and a rollout of two waves with a bake between them
        a, b = f"golden-set-a-{tag}", f"golden-set-b-{tag}"
        [source] = files(root / "sa", 1)
        [reader] = files(root / "sb", 1)
        reader["attributes"]["content"] = f"$stack.{a}/default.{source['id']}.content"
        shop = await client.start_workflow(
            "SetWorkflow",
            {
                "name": f"golden-{tag}",
                "operator": "golden",
                "members": [
                    {"project": a, "spec": {"resources": [source]}},
                    {"project": b, "spec": {"resources": [reader]}},
                ],
            },
            id=f"stackflow-set/golden-{tag}",
            task_queue=queue,
        )
        await phase(shop, "awaitingApproval")
        await shop.execute_update("approve", ApprovalInput(by="golden"))
        await shop.result()
        await save(client, shop, "set_apply", children=False)
        rollout = await client.start_workflow(
            "SetWorkflow",
            {
                "name": f"golden-roll-{tag}",
                "auto_approve": True,
                "members": [
                    {
                        "project": f"golden-roll{n}-{tag}",
                        "spec": {"resources": files(root / f"r{n}", 2)},
                    }
                    for n in (1, 2)
                ],
                "waves": [{"members": [0], "bake_seconds": 1}, {"members": [1]}],
            },
            id=f"stackflow-set/golden-roll-{tag}",
            task_queue=queue,
        )
        await rollout.result()
        await save(client, rollout, "set_rollout", children=False)

        # set-continue-as-new and set-run-on-releases: a set run past its history budget
        # continues as new before its apply and again before its rollback (a member fails);
        # its members' releases name the set run
        blocker = root / "blocker"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("a file where a directory must be\n")
        [good] = files(root / "c1", 1)
        [bad] = files(blocker, 1)
        chained = await client.start_workflow(
            "SetWorkflow",
            {
                "name": f"golden-chain-{tag}",
                "auto_approve": True,
                "history_budget": 0,
                "on_failure": "rollback",
                "members": [
                    {"project": f"golden-chain1-{tag}", "spec": {"resources": [good]}},
                    {
                        "project": f"golden-chain2-{tag}",
                        "spec": {"resources": [bad]},
                        "depends_on": [f"golden-chain1-{tag}/default"],
                    },
                ],
            },
            id=f"stackflow-set/golden-chain-{tag}",
            task_queue=queue,
        )
        await chained.result()
        run: str | None = chained.first_execution_run_id or chained.result_run_id
        for n in (1, 2, 3):
            link = client.get_workflow_handle(chained.id, run_id=run)
            await save(client, link, f"set_continued_{n}", children=False)
            last = (await link.fetch_history()).events[-1]
            run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id

        # local-small-preview (baseline-2026-11-29.2): a small auto-approved apply and its
        # destroy preview in a local activity, so each is two workflow tasks and one activity
        await apply_then_destroy(
            f"golden-localpreview-{tag}", "local_preview", spec={"resources": files(root / "lp", 2)}
        )
    await activities.registry.close()
    backend.close()


if __name__ == "__main__":
    asyncio.run(main())
