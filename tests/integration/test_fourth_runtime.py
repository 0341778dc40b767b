"""Adding a runtime touches no core file: a fourth runtime (tests/fixtures/ledger_runtime, a
package of its own, registered through the entry-point group) runs end to end like a
built-in: `stackflow apply` through a main worker and a worker of its own task queue
(``--runtimes ledger``), its own section of the worker policy file (narrowed per project),
and its nodes grouped as its rules say (``RuntimeRules.grouping``, carried by the plan)."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.ledger_install import ledger_paths
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import expect_exit

pytestmark = pytest.mark.integration


def _calls(directory: Path) -> list[dict[str, Any]]:
    log = directory / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def ledger(tmp_path: Path, stack_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A main worker and a Ledger worker, each on its own queue, the Ledger runtime
    installed for them and the CLI (only through PYTHONPATH), a policy file with a ledger
    section and a project's narrower one."""
    project = f"lg{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "ledger"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "ledger": {"directory": str(directory), "max_amount": 100},
                "projects": {project: {"ledger": {"max_amount": 50}}},
            }
        )
    )
    paths = ledger_paths(tmp_path / "plugins")
    env = {
        **stack_env,
        "PYTHONPATH": os.pathsep.join([str(REPO), *paths]),
        "STACKFLOW_RUNTIME_QUEUES": "on",
        "STACKFLOW_RUNTIME_QUEUE_TIMEOUT": "30",
        "STACKFLOW_POLICY_FILE": str(policy),
    }
    workers = {}
    for name in ("main", "ledger"):
        home = tmp_path / f"worker-{name}"
        home.mkdir()
        worker_env = {**env, "STACKFLOW_WORKER_RUNTIMES": name, "STACKFLOW_HOME": str(home)}
        workers[name] = WorkerProcess(home, stack_env["STACKFLOW_TASK_QUEUE"], worker_env)
    try:
        for worker in workers.values():
            worker.start()
        yield {"env": env, "project": project, "directory": directory, "workers": workers}
    finally:
        for worker in workers.values():
            worker.stop()


def test_a_fourth_runtime_applies_through_its_own_worker_policy_and_groups(
    tmp_path: Path, ledger: dict[str, Any]
) -> None:
    env, project, directory = ledger["env"], ledger["project"], ledger["directory"]
    main, own = ledger["workers"]["main"], ledger["workers"]["ledger"]
    queue = env["STACKFLOW_TASK_QUEUE"]
    logs = {"main": main.log.read_text(), "ledger": own.log.read_text()}
    # its own task queue, served by a worker that builds only its runtime
    assert f"task queue '{queue}-ledger' on" in logs["ledger"], logs["ledger"]
    assert "runtimes Ledger" in logs["ledger"] and "runtimes none" in logs["main"]
    # its own section of the policy file, read by both workers
    assert "runtime sections ledger" in logs["ledger"] and f"projects: {project}" in logs["main"]

    entries = [
        {"id": f"ledger:e{i}", "type": "Ledger", "attributes": {"amount": i + 1, "memo": "m"}}
        for i in range(6)
    ]
    spec = tmp_path / "ledger.yaml"
    spec.write_text(yaml.safe_dump({"resources": entries}))
    preview = expect_exit(run_cli(env, "preview", "-f", str(spec), "-p", project, "-o", "json"))
    assert json.loads(preview.stdout)["summary"]["Create"] == 6
    applied = expect_exit(
        run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "-o", "json")
    )
    assert json.loads(applied.stdout)["phase"] == "succeeded", applied.stdout
    stored = directory / project / "default"
    assert sorted(p.name for p in stored.iterdir()) == [f"e{i}.json" for i in range(6)]
    outputs = json.loads(expect_exit(run_cli(env, "output", "-p", project, "-o", "json")).stdout)
    assert outputs["ledger:e2"] == {"amount": 3, "memo": "m"}

    # every call on the Ledger worker's queue, in group activities of at most 3 nodes
    applies = [c for c in _calls(directory) if c["call"] == "apply"]
    assert len(applies) == 6
    assert {c["pid"] for c in applies} == {own.proc.pid if own.proc else None}
    assert {c["task_queue"] for c in applies} == {f"{queue}-ledger"}
    assert {c["activity"] for c in applies} == {"run_group"}, applies
    assert sorted(Counter(c["activity_id"] for c in applies).values()) == [3, 3], applies

    # the project's section narrows the worker's: 70 is within the worker's 100, not its 50
    over = [*entries, {"id": "ledger:big", "type": "Ledger", "attributes": {"amount": 70}}]
    spec.write_text(yaml.safe_dump({"resources": over}))
    refused = run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "ledger:big: attributes.amount: 70 is above 50" in refused.stdout + refused.stderr
    assert not (stored / "big.json").exists()
    spec.write_text(yaml.safe_dump({"resources": entries}))  # the stack as it is again
    again = expect_exit(
        run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "-o", "json")
    )
    assert json.loads(again.stdout)["phase"] == "succeeded", again.stdout
    assert len([c for c in _calls(directory) if c["call"] == "apply"]) == 6  # nothing to do

    destroyed = run_cli(env, "destroy", "-p", project, "--yes", "-o", "json")
    assert json.loads(expect_exit(destroyed).stdout)["phase"] == "succeeded"
    assert list(stored.iterdir()) == []
    deletes = [c for c in _calls(directory) if c["call"] == "delete"]
    assert len(deletes) == 6 and {c["activity"] for c in deletes} == {"run_group"}
