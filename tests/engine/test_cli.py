"""Offline CLI commands in-process (typer's CliRunner)."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from stackflow.cli.app import EXIT_CODES_HELP, StackflowGroup, app
from stackflow.cli.main import load_commands
from stackflow.core.errors import FencedError, StackLockedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Phase, Release, State
from stackflow.model.spec import Resource, ResourceType
from stackflow.state.backend import StateBackend, open_backend
from stackflow.state.kusion import read_kusion_stack

KUSION_HOME = Path(__file__).resolve().parents[3] / "shared/compat/kusion/release/storages/testdata"
STACK = StackRef("p", "w")

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


def invoke(
    home: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run the CLI with ``home`` as STACKFLOW_HOME (its default backend: SQLite in it)."""
    environment: dict[str, str | None] = {"STACKFLOW_HOME": str(home), "STACKFLOW_STATE_URL": None}
    environment.update(env or {})
    return CliRunner().invoke(app, list(args), input=stdin, env=environment)


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


def _backend(home: Path) -> StateBackend:
    """The backend the CLI opens by default: SQLite in STACKFLOW_HOME."""
    return open_backend(f"sqlite:///{home / 'state.db'}")


@pytest.fixture
def store(home: Path) -> Iterator[StateBackend]:
    backend = _backend(home)
    try:
        yield backend
    finally:
        backend.close()


def test_release_list_show_unlock(home: Path, store: StateBackend) -> None:
    first = store.create(STACK, Operation.apply, None)
    store.record_resource(STACK, 1, Resource(id="a", type=ResourceType.OnPrem))
    store.set_phase(STACK, first.revision, Phase.succeeded)
    store.create(STACK, Operation.destroy, None)  # no run: held by nobody alive
    store.set_phase(STACK, 2, Phase.destroying)

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

    # a lock with no run names nobody Temporal could ask about: it unlocks at once
    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert result.exit_code == 0 and "release 2 is now failed" in result.stdout
    after = store.latest(STACK)
    assert after is not None and after.phase is Phase.failed and "unlocked" in (after.error or "")
    assert store.lock(STACK) is None
    again = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert again.exit_code == 0 and "not locked" in again.stdout


def _ended(answer: str | None, asked: list[RunRef]) -> Any:
    async def ended(_ctx: Any, holder: RunRef) -> str | None:
        asked.append(holder)
        return answer

    return ended


def test_unlock_refuses_while_the_holding_run_is_open(
    home: Path, store: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunRef("apply-p-w", "run-1")
    store.create(STACK, Operation.apply, None, run=run)
    asked: list[RunRef] = []
    monkeypatch.setattr("stackflow.api.release_admin.holder_ended", _ended(None, asked))
    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert result.exit_code == 3 and asked == [run]
    assert f"held by {run}, which is still running" in result.stderr
    assert "--force" in result.stderr
    assert store.lock(STACK).holder() == run  # type: ignore[union-attr]
    assert store.phase_of(STACK, 1) is Phase.generating

    # once Temporal says the run has ended, its release is closed as failed, saying why
    ended = _ended(f"{run} was terminated", asked)
    monkeypatch.setattr("stackflow.api.release_admin.holder_ended", ended)
    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert result.exit_code == 0, result.stderr
    assert "release 1 is now failed" in result.stdout and len(asked) == 2
    failed = store.get(STACK, 1)
    assert failed.phase is Phase.failed
    # the release says who unlocked it: the local user, the API's caller in this process
    assert failed.error == f"{run} was terminated; unlocked by hand by {getpass.getuser()}"
    assert store.lock(STACK) is None


def test_unlock_force_does_not_ask_temporal(
    home: Path, store: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunRef("apply-p-w", "run-1")
    store.create(STACK, Operation.apply, None, run=run)
    asked: list[RunRef] = []
    monkeypatch.setattr("stackflow.api.release_admin.holder_ended", _ended(None, asked))
    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w", "--force")
    assert result.exit_code == 0, result.stderr
    assert "release 1 is now failed" in result.stdout and asked == []
    failed = store.get(STACK, 1)
    assert failed.phase is Phase.failed and str(run) in (failed.error or "")
    assert "--force" in (failed.error or "")
    # the run that held the stack is fenced out from now on
    with pytest.raises(FencedError):
        store.record_resource(STACK, 1, Resource(id="a", type=ResourceType.OnPrem), run=run)


def test_release_errors(home: Path) -> None:
    result = invoke(home, "release", "show", "-p", "p", "-w", "w")
    assert result.exit_code == 1 and result.stderr == "Error: stack p/w has no releases\n"
    result = invoke(home, "release", "unlock", "-p", "p", "-w", "w")
    assert result.exit_code == 1 and result.stderr == "Error: stack p/w has no releases\n"
    result = invoke(home, "release", "show", "-p", "p", "-w", "w", "-r", "7")
    assert result.exit_code == 1 and "release p/w/7 not found" in result.stderr


def test_state_url_chooses_the_backend(home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.db"
    store = open_backend(f"sqlite:///{elsewhere}")
    store.create(STACK, Operation.apply, None)
    store.close()
    url = {"STACKFLOW_STATE_URL": f"sqlite:///{elsewhere}"}
    listed = invoke(home, "release", "list", "-p", "p", "-w", "w", "-o", "json", env=url)
    assert listed.exit_code == 0 and [r["revision"] for r in json.loads(listed.stdout)] == [1]
    assert not (home / "state.db").exists()
    for bad, message in (
        ("mysql://u:secret@db/x", "scheme 'mysql' is not supported"),
        ("not a url", "is not a URL"),
    ):
        result = invoke(home, "release", "list", "-p", "p", env={"STACKFLOW_STATE_URL": bad})
        assert result.exit_code == 2 and message in result.stderr
        assert "secret" not in result.stderr


def test_release_import(home: Path) -> None:
    result = invoke(home, "release", "import", "--kusion-home", str(KUSION_HOME))
    assert result.exit_code == 0, result.stderr
    assert "imported 3 release(s) of test_project/test_ws" in result.stdout
    store = _backend(home)
    stack = StackRef("test_project", "test_ws")
    imported = store.list(stack)
    assert [(r.revision, r.phase, r.stack) for r in imported] == [
        (rev, Phase.succeeded, "test_stack") for rev in (1, 2, 3)
    ]
    assert store.lock(stack) is None  # nothing in progress: not locked
    store.close()
    again = invoke(home, "release", "import", "--kusion-home", str(KUSION_HOME))
    assert again.exit_code == 1 and "already has stackflow releases" in again.stderr


def test_release_export_writes_kusions_layout(home: Path, tmp_path: Path) -> None:
    assert invoke(home, "release", "import", "--kusion-home", str(KUSION_HOME)).exit_code == 0
    out = tmp_path / "kusion"
    result = invoke(home, "release", "export", "--kusion-layout", str(out))
    assert result.exit_code == 0, result.stderr
    assert "exported 3 release(s) of test_project/test_ws" in result.stdout
    exported = read_kusion_stack(out / "releases" / "test_project" / "test_ws")
    original = read_kusion_stack(KUSION_HOME / "releases" / "test_project" / "test_ws")
    assert [(r.revision, r.phase, r.state) for r in exported] == [
        (r.revision, r.phase, r.state) for r in original
    ]
    other = tmp_path / "none"
    result = invoke(home, "release", "export", "--kusion-layout", str(other), "-p", "nope")
    assert result.exit_code == 0 and "nothing to export" in result.stdout
    assert not other.exists()


def _legacy_home(root: Path) -> Path:
    """A home as stackflow kept it before the state backend: record files and journals."""
    stamp = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)

    def write(revision: int, phase: Phase, resources: list[Resource]) -> Path:
        release = Release(
            project="p",
            workspace="w",
            revision=revision,
            phase=phase,
            state=State(resources=resources),
            created_at=stamp,
            modified_at=stamp,
        )
        record = {
            "metadata": {"namespace": "p/w", "type": "Release", "id": str(revision)},
            "spec": release.model_dump(mode="json", by_alias=True),
        }
        path = root / "releases" / "p" / "w" / f"{revision}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(record))
        return path

    a, b = Resource(id="a", type=ResourceType.OnPrem), Resource(id="b", type=ResourceType.OnPrem)
    write(1, Phase.succeeded, [a])
    second = write(2, Phase.applying, [a])
    upsert = {"op": "upsert", "resource": b.model_dump(mode="json", by_alias=True)}
    second.with_name("2.journal.jsonl").write_text(
        json.dumps(upsert) + "\n" + json.dumps({"op": "delete", "id": "a"}) + "\n" + '{"op": "ups'
    )  # the last line was torn by a crash: it never happened
    return root


def test_state_migrate_imports_an_old_home(home: Path, tmp_path: Path) -> None:
    result = invoke(home, "state", "migrate")
    assert result.exit_code == 0, result.stderr
    store = _backend(home)
    assert f"schema at {store.head_revision()}" in result.stdout
    old = _legacy_home(tmp_path / "old-home")
    result = invoke(home, "state", "migrate", "--from-dir", str(old))
    assert result.exit_code == 0, result.stderr
    assert "imported 2 release(s) of p/w" in result.stdout
    assert [(r.revision, r.phase) for r in store.list(STACK)] == [
        (1, Phase.succeeded),
        (2, Phase.applying),
    ]
    assert [r.id for r in store.get(STACK, 2).state.resources] == ["b"]  # journal folded
    lock = store.lock(STACK)  # still in progress when migrated: held by nobody, by hand
    assert lock is not None and lock.revision == 2 and lock.holder() is None
    store.close()
    again = invoke(home, "state", "migrate", "--from-dir", str(old))
    assert again.exit_code == 1 and "already has stackflow releases" in again.stderr


def test_help_documents_exit_codes(home: Path) -> None:
    result = invoke(home, "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for code in (
        "0 ok",
        "1 operation failed",
        "2 bad input",
        "3 stack locked",
        "4 run paused on failed nodes",
    ):
        assert code in text
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
