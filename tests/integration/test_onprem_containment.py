"""Files inside a managed Directory, written as people write them (no ``dependsOn``): the
Directory is created before them and deleted after them, also with twelve stacks at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, dir_resource, file_resource, new_project, write_spec

STACKS = 12
FILES = 100


def _all_at_once(env: dict[str, str], commands: list[list[str]]) -> list[tuple[int, str]]:
    stackflow = str(REPO / ".venv" / "bin" / "stackflow")
    procs = [
        subprocess.Popen(
            [stackflow, *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append((proc.returncode, out + err))
    return results


def test_twelve_stacks_of_a_directory_and_its_files_apply_and_destroy_at_once(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env = stack_env
    projects = [new_project() for _ in range(STACKS)]
    specs = []
    for n, project in enumerate(projects):
        root = tmp_path / f"site{n}"
        files = [file_resource(root / f"f{i:03}.conf", f"{i}\n") for i in range(FILES)]
        specs.append(write_spec(tmp_path / f"{project}.yaml", [*files, dir_resource(root)]))

    graph = cli_json(run_cli(env, "graph", "-f", str(specs[0]), "--output", "json"))
    directory = f"onprem:Directory:{tmp_path / 'site0'}"
    assert graph["layers"][0] == [directory]
    assert sorted(dep for dep, _ in graph["edges"]) == [directory] * FILES

    applies = _all_at_once(
        env,
        [["apply", "-f", str(s), "-p", p, "--yes"] for s, p in zip(specs, projects, strict=True)],
    )
    assert [code for code, _ in applies] == [0] * STACKS, [out for _, out in applies]
    assert all(len(list((tmp_path / f"site{n}").iterdir())) == FILES for n in range(STACKS))

    destroys = _all_at_once(env, [["destroy", "-p", p, "--yes"] for p in projects])
    assert [code for code, _ in destroys] == [0] * STACKS, [out for _, out in destroys]
    assert not any((tmp_path / f"site{n}").exists() for n in range(STACKS))
