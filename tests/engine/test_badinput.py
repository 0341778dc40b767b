"""Every file of tests/badinput: one clear error line, exit code 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stackflow.cli.app import app
from stackflow.cli.main import load_commands

BAD = Path(__file__).resolve().parents[1] / "badinput"
STACKFLOW = Path(sys.executable).parent / "stackflow"

# file -> a fragment the error line must contain
EXPECTED = {
    "alias_bomb.yaml": "alias_bomb.yaml: line 12: excessive aliasing (aliases that expand to",
    "deep_nesting.yaml": "deep_nesting.yaml: line 6: collections nested deeper than 512 levels",
    "bad_kubernetes_id.yaml": "resources[0] (id 'web'): id: a Kubernetes id is",
    "cycle.yaml": "dependency cycle: a -> b -> c -> a",
    "dangling_dependency.yaml": "dependsOn: unknown resource 'v1:Namespace:ns'",
    "dangling_reference.yaml": "names no resource of the spec",
    "duplicate_key.json": 'duplicate_key.json: line 10: duplicate key "mode" (first at line 10)',
    "duplicate_key_in_attributes.yaml": (
        'duplicate_key_in_attributes.yaml: line 12: duplicate key "replicas" (first at line 11)'
    ),
    "duplicate_key_top_level.yaml": (
        'duplicate_key_top_level.yaml: line 5: duplicate key "resources" (first at line 2)'
    ),
    "duplicate_ids.yaml": "resources[1] (id 'v1:Namespace:ns'): id: duplicate of resources[0]",
    "empty.yaml": "got nothing",
    "invalid_utf8.yaml": "invalid YAML",
    "malformed.json": "invalid YAML at line 1",
    "malformed.yaml": "invalid YAML at line 4",
    "missing_type.yaml": "resources[0] (id 'a'): type: Field required",
    "no_resources_key.yaml": "needs a top-level 'resources' list",
    "non_string_id.yaml": "resources[0]: id: Input should be a valid string",
    "reference_cycle.yaml": (
        "dependency cycle: v1:ConfigMap:ns:a -> v1:ConfigMap:ns:b -> v1:ConfigMap:ns:a"
    ),
    "resources_not_a_list.yaml": "resources: Input should be a valid list",
    "top_level_list.yaml": "got list",
    "top_level_scalar.yaml": "got str",
    "unknown_field.yaml": "resources[0] (id 'a'): depends: unknown field",
    "unknown_type.yaml": "type: unknown type 'Ansible'",
}


def test_corpus_is_covered() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(EXPECTED)


def check_rejected(exit_code: int, stdout: str, stderr: str, path: Path, home: Path) -> None:
    lines = stderr.splitlines()
    assert exit_code == 2, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: {path}: ")
    assert EXPECTED.get(path.name, "") in lines[0]
    assert stdout == ""
    assert not home.exists() or not any(home.iterdir())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_rejects(name: str, tmp_path: Path) -> None:
    load_commands()
    home = tmp_path / "home"
    path = BAD / name
    result = CliRunner().invoke(
        app, ["validate", "-f", str(path)], env={"STACKFLOW_HOME": str(home)}
    )
    check_rejected(result.exit_code, result.stdout, result.stderr, path, home)


def test_50mb_attribute_refused_quickly(tmp_path: Path) -> None:
    load_commands()
    path = tmp_path / "huge.yaml"
    with open(path, "w") as fh:
        fh.write("resources:\n  - id: a\n    type: OnPrem\n    attributes:\n      blob: ")
        fh.write("x" * 50_000_000)
        fh.write("\n")
    home = tmp_path / "home"
    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["validate", "-f", str(path)], env={"STACKFLOW_HOME": str(home)}
    )
    elapsed = time.monotonic() - started
    check_rejected(result.exit_code, result.stdout, result.stderr, path, home)
    assert "attributes: 50000011 bytes serialised, the limit is 1048576 bytes" in result.stderr
    assert elapsed < 15, elapsed


def test_console_script_as_a_real_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "STACKFLOW_HOME": str(home), "COLUMNS": "40"}
    path = BAD / "cycle.yaml"
    proc = subprocess.run(
        [str(STACKFLOW), "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    check_rejected(
        proc.returncode, proc.stdout, proc.stderr, path, home
    )  # not wrapped at 40 columns
    good = tmp_path / "good.yaml"
    good.write_text(
        "resources:\n- {id: a, type: OnPrem}\n- {id: b, type: OnPrem, dependsOn: [a]}\n"
    )
    proc = subprocess.run(
        [str(STACKFLOW), "validate", "-f", "-"],
        input=good.read_text(),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "valid: 2 resources, 2 layers\n"
    assert not home.exists()
