"""`$kusion_path` references: exact previews before and after the dependency changes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, dir_resource, file_resource, new_project, write_spec


def _ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return cli_json(proc)


def _by_id(preview: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in preview["changes"]}


def test_a_reference_previews_exactly_and_follows_its_dependency(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env = stack_env
    common = ("--project", new_project(), "--output", "json")
    root = tmp_path / "site"
    d = dir_resource(root)
    src = file_resource(root / "source.txt", "v1\n", deps=[d["id"]])
    copy = file_resource(root / "copy.txt", f"$kusion_path.{src['id']}.content")

    def spec(source: dict[str, Any]) -> Path:
        return write_spec(tmp_path / "spec.yaml", [d, source, copy])

    # Before anything exists the referenced value is unknown, and shown as such.
    first = _by_id(_ok(run_cli(env, "preview", "-f", str(spec(src)), *common)))
    assert first[copy["id"]]["action"] == "Create"
    assert {"path": "content", "old": None, "new": "(known after apply)"} in first[copy["id"]][
        "diff"
    ]

    _ok(run_cli(env, "apply", "-f", str(spec(src)), "--yes", *common))
    assert (root / "copy.txt").read_text() == "v1\n"

    # Resolved from the recorded state, the reference is no change at all.
    again = _ok(run_cli(env, "preview", "-f", str(spec(src)), *common))
    assert {c["action"] for c in again["changes"]} == {"UnChanged"}

    # Changing the referenced field makes the referencing resource change too.
    v2 = file_resource(root / "source.txt", "v2\n", deps=[d["id"]])
    changed = _by_id(_ok(run_cli(env, "preview", "-f", str(spec(v2)), *common)))
    assert changed[src["id"]]["action"] == "Update"
    assert changed[copy["id"]]["action"] == "Update"
    assert changed[d["id"]]["action"] == "UnChanged"
    _ok(run_cli(env, "apply", "-f", str(spec(v2)), "--yes", *common))
    assert (root / "copy.txt").read_text() == "v2\n"

    # Changing another field of the dependency leaves the referencing resource alone.
    v2_private = dict(v2, attributes=dict(v2["attributes"], mode="0600"))
    other = _by_id(_ok(run_cli(env, "preview", "-f", str(spec(v2_private)), *common)))
    assert other[src["id"]]["action"] == "Update"
    assert other[copy["id"]]["action"] == "UnChanged"
