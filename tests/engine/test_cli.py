"""Offline CLI commands in-process (typer's CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from stackflow.store import FileRecordStore
from typer.testing import CliRunner, Result

from cli.app import EXIT_CODES_HELP, StackflowGroup, app
from cli.main import load_commands
from stackflow.errors import StackLockedError
from stackflow.release import Operation, Phase, ReleaseStore
from stackflow.spec import Resource, ResourceType

KUSION_HOME = Path(__file__).resolve().parents[3] / "shared/compat/kusion/release/storages/testdata"

SPEC = """
resources:
  - id: v1:Namespace:ns
    type: Kubernetes
    attributes: {apiVersion: v1, kind: Namespace, metadata: {name: ns}}
  - id: hashicorp:random:random_password:pw
    type: Terraform
    attributes: {length: 16}
  - id: apps/v1:Deployment:ns:web
    type: Kubernetes
    dependsOn: [v1:Namespace:ns]
    attributes:
      env: $kusion_path.hashicorp:random:random_password:pw.result
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture(autouse=True)
def _commands() -> None:
    load_commands()


def invoke(home: Path, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), input=stdin, env={"STACKFLOW_HOME": str(home)})


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def test_validate(home: Path, spec_file: Path) -> None:
    result = invoke(home, "validate", "-f", str(spec_file))
    assert result.exit_code == 0 and result.stdout == "valid: 3 resources, 2 layers\n"
    result = invoke(home, "validate", "-f", "-", stdin=SPEC)
    assert result.exit_code == 0 and "3 resources" in result.stdout
    assert not home.exists()


def test_graph_outputs(home: Path, spec_file: Path) -> None:
    result = invoke(home, "graph", "-f", str(spec_file), "--output", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "layers": [
            ["hashicorp:random:random_password:pw", "v1:Namespace:ns"],
            ["apps/v1:Deployment:ns:web"],
        ],
        "edges": [
            ["hashicorp:random:random_password:pw", "apps/v1:Deployment:ns:web"],
            ["v1:Namespace:ns", "apps/v1:Deployment:ns:web"],
        ],
    }
    dot = invoke(home, "graph", "-f", str(spec_file), "-o", "dot").stdout
    assert dot.startswith("digraph")
    assert '"v1:Namespace:ns" -> "apps/v1:Deployment:ns:web";' in dot
    table = invoke(home, "graph", "-f", str(spec_file)).stdout
    assert (
        "Layer 1" in table
        and "Layer 2" in table
        and "(after hashicorp:random:random_password:pw, v1:Namespace:ns)" in table
    )


def _release_store(home: Path) -> ReleaseStore:
    return ReleaseStore(FileRecordStore(home))


def test_release_list_show_unlock(home: Path) -> None:
    store = _release_store(home)
    first = store.create("p", "w", Operation.apply, None)
    store.record_resource("p", "w", 1, Resource(id="a", type=ResourceType.OnPrem))
    store.set_phase("p", "w", first.revision, Phase.succeeded)
    store.create("p", "w", Operation.destroy, None)
    store.set_phase("p", "w", 2, Phase.destroying)

    listed = json.loads(invoke(home, "release", "list", "-p", "p", "-w", "w", "-o", "json").stdout)
    assert [(r["revision"], r["operation"], r["phase"], r["resources"]) for r in listed] == [
        (1, "apply", "succeeded", 1),
        (2, "destroy", "destroying", 1),
    ]
    table = invoke(home, "release", "list", "--project", "p", "--workspace", "w").stdout
    assert "destroying" in table and "succeeded" in table

    shown = json.loads(
        invoke(home, "release", "show", "-p", "p", "-w", "w", "-r", "1", "-o", "json").stdout
    )
    assert shown["revision"] == 1 and shown["state"]["resources"][0]["id"] == "a"
    latest = invoke(home, "release", "show", "-p", "p", "-w", "w").stdout
    assert "destroying" in latest

    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert result.exit_code == 0 and "release 2 is now failed" in result.stdout
    assert store.latest("p", "w").phase is Phase.failed  # type: ignore[union-attr]
    again = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert again.exit_code == 0 and "not locked" in again.stdout


def test_release_errors(home: Path) -> None:
    result = invoke(home, "release", "show", "-p", "p", "-w", "w")
    assert result.exit_code == 1 and result.stderr == "Error: stack p/w has no releases\n"
    result = invoke(home, "release", "list", "-p", "../x", "-w", "w")
    assert result.exit_code == 2 and "invalid namespace" in result.stderr


def test_release_import(home: Path) -> None:
    result = invoke(home, "release", "import", "--kusion-home", str(KUSION_HOME))
    assert result.exit_code == 0, result.stderr
    assert "imported 3 release(s) of test_project/test_ws" in result.stdout
    assert (home / "releases" / "test_project" / "test_ws" / "3.yaml").is_file()
    again = invoke(home, "release", "import", "--kusion-home", str(KUSION_HOME))
    assert again.exit_code == 1 and "already has stackflow releases" in again.stderr


def test_help_documents_exit_codes(home: Path) -> None:
    result = invoke(home, "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "0 ok, 1 operation failed, 2 bad input, 3 stack locked" in text
    assert EXIT_CODES_HELP.startswith("Exit codes")


def test_error_translation_for_any_command() -> None:
    """Commands registered later (e.g. cli/operations.py) get the same exit codes."""
    probe = typer.Typer(cls=StackflowGroup)

    @probe.command()
    def locked() -> None:
        raise StackLockedError("stack p/w is locked: release 7 is applying")

    @probe.command()
    def other() -> None:
        pass

    result = CliRunner().invoke(probe, ["locked"])
    assert result.exit_code == 3
    assert result.stderr == "Error: stack p/w is locked: release 7 is applying\n"
