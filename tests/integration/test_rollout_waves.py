"""A rollout on the dev services: one Kubernetes ConfigMap per target over six workspaces in
three waves with a 10 s bake, by a worker of this tree. Wave order is proven from the
recorded release times; a failure in wave 2 (error budget 0) halts before wave 3 and
rollback restores what waves 1 and 2 changed."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from stackflow.model.release import Operation, Phase
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import all_releases, cli_json, file_resource

BAKE = 10.0


class Rollout:
    def __init__(self, root: Path) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.root = root
        self.project = f"roll{self.tag}"
        self.targets = [f"w{n}" for n in range(1, 7)]
        self.file = root / "rollout.yaml"
        self.file.write_text(
            yaml.safe_dump(
                {
                    "name": f"rollout-{self.tag}",
                    "stacks": [
                        {"project": self.project, "workspace": w, "spec": f"{w}.yaml"}
                        for w in self.targets
                    ],
                    "strategy": {
                        "waves": [
                            {
                                "targets": [f"{self.project}/w1", f"{self.project}/w2"],
                                "bake": "10s",
                            },
                            {"targets": [f"{self.project}/w[34]"], "max_parallel": 2, "bake": 10},
                            {"targets": [f"{self.project}/w[56]"]},
                        ],
                        "error_budget": 0,
                    },
                }
            )
        )

    def name(self, target: str) -> str:
        return f"cm-{self.tag}-{target}"

    def write(self, version: str, broken: str | None = None) -> None:
        for target in self.targets:
            data: Any = {"version": version}
            if target == broken:
                data = {"version": {"not": "a string"}}  # the API server refuses it
            spec = {
                "resources": [
                    {
                        "id": f"v1:ConfigMap:default:{self.name(target)}",
                        "type": "Kubernetes",
                        "attributes": {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": self.name(target), "namespace": "default"},
                            "data": data,
                        },
                    }
                ]
            }
            (self.root / f"{target}.yaml").write_text(yaml.safe_dump(spec))


def _apply(env: dict[str, str], rollout: Rollout, *extra: str, code: int) -> dict[str, Any]:
    proc = run_cli(env, "set", "apply", "-f", str(rollout.file), "--yes", "-o", "json", *extra)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    view: dict[str, Any] = cli_json(proc)
    return view


def test_waves_in_order_with_bake_and_a_halt_that_rolls_back(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, api: k8s.ApiClient
) -> None:
    env = stack_env
    rollout = Rollout(tmp_path)
    rollout.write("1")
    view = _apply(env, rollout, code=0)
    assert view["phase"] == "succeeded" and view["wave"] == 2
    runs = {w: all_releases(env, rollout.project, w)[-1] for w in rollout.targets}
    waves = [["w1", "w2"], ["w3", "w4"], ["w5", "w6"]]
    for earlier, later in itertools.pairwise(waves):
        done = max(runs[w].modified_at for w in earlier)
        started = min(runs[w].created_at for w in later)
        assert (started - done).total_seconds() >= BAKE, (earlier, later, done, started)

    def data(target: str) -> dict[str, str]:
        cm = k8s.CoreV1Api(api).read_namespaced_config_map(rollout.name(target), "default")
        return dict(cm.data)

    assert all(data(w) == {"version": "1"} for w in rollout.targets)

    # version 2 with w3 broken: wave 1 applies and bakes, wave 2 fails, wave 3 never starts,
    # and what the rollout changed goes back to version 1
    rollout.write("2", broken="w3")
    view = _apply(env, rollout, "--on-failure", "rollback", code=1)
    by = {m["workspace"]: m for m in view["members"]}
    assert view["error_type"] == "RolloutHalted" and "halted in wave 2" in view["error"]
    assert by["w3"]["phase"] == "failed"
    assert by["w5"]["phase"] == by["w6"]["phase"] == "skipped"
    assert "not started: the rollout halted in wave 2" in by["w5"]["error"]
    assert sorted(view["rolled_back"]) == sorted(
        f"{rollout.project}/{w}" for w in ("w1", "w2", "w4")
    )
    assert all(data(w) == {"version": "1"} for w in rollout.targets)
    for target in ("w1", "w2", "w4"):
        kinds = [(r.operation, r.phase) for r in all_releases(env, rollout.project, target)]
        assert kinds == [
            (Operation.apply, Phase.succeeded),
            (Operation.apply, Phase.succeeded),
            (Operation.rollback, Phase.succeeded),
        ], target
    for target in ("w5", "w6"):
        assert len(all_releases(env, rollout.project, target)) == 1
    gone = run_cli(env, "set", "destroy", "-f", str(rollout.file), "--yes", timeout=300)
    assert gone.returncode == 0, gone.stderr


DENY = """package stackflow

import rego.v1

deny contains {"msg": "content says forbidden", "resource": c.id} if {
	some c in input.changes
	contains(c.after.content, "forbidden")
}
"""


def test_a_policy_gate_holds_a_whole_wave_and_a_halt_rolls_back(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, f"s43-{uuid.uuid4().hex[:8]}"
    bundle = tmp_path / "policy"
    bundle.mkdir()
    (bundle / "gate.rego").write_text(DENY)
    pushed = run_cli(env, "policy", "push", "-p", project, str(bundle))
    assert pushed.returncode == 0, pushed.stderr
    files = {w: tmp_path / f"{w}.txt" for w in ("w1", "w2", "w3")}
    stacks = []
    for w, path in files.items():
        content = "forbidden\n" if w == "w3" else f"{w}\n"
        (tmp_path / f"{w}.yaml").write_text(
            yaml.safe_dump({"resources": [file_resource(path, content)]})
        )
        stacks.append({"project": project, "workspace": w, "spec": f"{w}.yaml"})
    waves = [{"targets": [f"{project}/w1"]}, {"targets": [f"{project}/w[23]"], "gate": "policy"}]
    set_file = tmp_path / "gated.yaml"
    name = f"gated-{project}"
    set_file.write_text(
        yaml.safe_dump({"name": name, "stacks": stacks, "strategy": {"waves": waves}})
    )
    proc = run_cli(
        env, "set", "apply", "-f", str(set_file), "--yes", "-o", "json", "--on-failure", "rollback"
    )
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"
    view = cli_json(proc)
    by = {m["workspace"]: m for m in view["members"]}
    assert view["error_type"] == "RolloutHalted", view
    assert view["error"].startswith(f"the rollout halted before wave 2: {project}/w3: "), view
    assert "policy denied" in view["error"] and "content says forbidden" in view["error"]
    assert by["w3"]["phase"] == "failed" and by["w3"]["error_type"] == "PolicyDenied", by["w3"]
    assert by["w2"]["phase"] == "skipped"  # allowed, but its wave never started
    assert view["rolled_back"] == [f"{project}/w1"]
    assert not any(path.exists() for path in files.values())
    kinds = [(r.operation, r.phase) for r in all_releases(env, project, "w1")]
    assert kinds == [(Operation.apply, Phase.succeeded), (Operation.destroy, Phase.succeeded)]
    assert all_releases(env, project, "w2") == all_releases(env, project, "w3") == []
