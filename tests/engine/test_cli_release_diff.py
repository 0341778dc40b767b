"""`stackflow release diff` and `stackflow output ID[.path]` in-process over releases written
through the state backend's API (sealed with keys, as the dev loop and deployments run)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from stackflow.cli.app import app
from stackflow.cli.main import load_commands
from stackflow.core.crypto import KeyRing, new_key_line
from stackflow.core.errors import NotFoundError, SpecError
from stackflow.core.refs import StackRef
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import Resource, Spec
from stackflow.state.backend import StateBackend, open_backend

KEY = new_key_line("k1")
CM = "v1:ConfigMap:ns:cm"
SECRET = "v1:Secret:ns:db"
PW = "hashicorp:random:random_password:pw"
COPY = "onprem:File:/tmp/motd"
OLD_PW, NEW_PW = "old-Pa55word-x", "new-Pa55word-y"
OLD_TOKEN, NEW_TOKEN = "ctx-T0ken-one", "ctx-T0ken-two"
SECRETS = (OLD_PW, NEW_PW, OLD_TOKEN, NEW_TOKEN)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(autouse=True)
def _commands() -> None:
    load_commands()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def invoke(home: Path, *args: str, keys: bool = True) -> Result:
    env: dict[str, str | None] = {
        "STACKFLOW_HOME": str(home),
        "STACKFLOW_STATE_URL": None,
        "STACKFLOW_ENCRYPTION_KEY": KEY if keys else None,
        "STACKFLOW_ENCRYPTION_KEY_FILE": None,
    }
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def store(home: Path) -> Iterator[StateBackend]:
    backend = open_backend(f"sqlite:///{home / 'state.db'}", keys=KeyRing.parse(KEY, "test"))
    try:
        yield backend
    finally:
        backend.close()


def _resources(data: str, password: str) -> tuple[list[Resource], list[Resource]]:
    """(spec, recorded state) of a ConfigMap, a Secret, a generated password and a file
    whose content takes the password through $kusion_path."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "ns"}}
    spec = [
        Resource.model_validate(
            {"id": CM, "type": "Kubernetes", "attributes": {**cm, "data": {"mode": data}}}
        ),
        Resource.model_validate(
            {
                "id": SECRET,
                "type": "Kubernetes",
                "attributes": {**secret, "stringData": {"password": password}},
            }
        ),
        Resource.model_validate({"id": PW, "type": "Terraform", "attributes": {"length": 14}}),
        Resource.model_validate(
            {
                "id": COPY,
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": "/tmp/motd",
                    "content": f"$kusion_path.{PW}.result",
                },
            }
        ),
    ]
    state = [
        spec[0].model_copy(update={"attributes": {**cm, "data": {"mode": data}, "x": [1, 2]}}),
        spec[1].model_copy(
            update={"attributes": {**secret, "type": "Opaque", "data": {"password": b64(password)}}}
        ),
        spec[2].model_copy(
            update={
                "attributes": {"length": 14, "result": password, "_stackflow_sensitive": ["result"]}
            }
        ),
        # recorded as an older stackflow did: without the taint written down
        spec[3].model_copy(
            update={"attributes": {"kind": "File", "path": "/tmp/motd", "content": password}}
        ),
    ]
    return spec, state


def _release(store: StateBackend, data: str, password: str, token: str) -> int:
    spec, state = _resources(data, password)
    release = store.create(
        StackRef("p", "w"), Operation.apply, Spec(resources=spec, context={"env": {"TOKEN": token}})
    )
    for resource in state:
        store.record_resource(StackRef("p", "w"), release.revision, resource)
    store.set_phase(StackRef("p", "w"), release.revision, Phase.succeeded)
    return release.revision


@pytest.fixture
def two(store: StateBackend) -> None:
    assert _release(store, "fast", OLD_PW, OLD_TOKEN) == 1
    assert _release(store, "slow", NEW_PW, NEW_TOKEN) == 2


def _no_secret(result: Result) -> None:
    text = result.stdout + result.stderr
    for secret in SECRETS:
        assert secret not in text and b64(secret) not in text


@pytest.mark.usefixtures("two")
def test_release_diff_names_the_changed_resources_and_fields_masked(home: Path) -> None:
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "1", "2", "-o", "json")
    assert result.exit_code == 0, result.stderr
    _no_secret(result)
    data = json.loads(result.stdout)
    assert (data["old_revision"], data["new_revision"]) == (1, 2)

    def fields(section: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["id"], f["path"]): f for r in data[section]["resources"] for f in r["fields"]}

    spec, state = fields("spec"), fields("state")
    assert spec[(CM, "data.mode")] == {
        "path": "data.mode",
        "kind": "changed",
        "old": "fast",
        "new": "slow",
        "sensitive": False,
    }
    assert state[(CM, "data.mode")]["old"] == "fast" and state[(CM, "data.mode")]["new"] == "slow"
    # the Secret's value changed: said so, values masked, in the spec and in the state
    assert spec[(SECRET, "stringData.password")]["kind"] == "changed"
    assert state[(SECRET, "data.password")] == {
        "path": "data.password",
        "kind": "changed",
        "old": "(sensitive value)",
        "new": "(sensitive value)",
        "sensitive": True,
    }
    # the generated password and the file that took it through $kusion_path
    assert state[(PW, "result")]["sensitive"] and state[(COPY, "content")]["sensitive"]
    assert set(spec) == {(CM, "data.mode"), (SECRET, "stringData.password")}
    assert [(f["path"], f["kind"], f["sensitive"]) for f in data["spec"]["fields"]] == [
        ("context.env.TOKEN", "changed", True)
    ]
    assert data["state"]["summary"] == {"added": 0, "removed": 0, "changed": 4, "unchanged": 0}

    table = invoke(home, "release", "diff", "--project", "p", "--workspace", "w", "1", "2")
    assert table.exit_code == 0, table.stderr
    _no_secret(table)
    assert "p/w: revision 1 → 2" in table.stdout
    assert f"~ {CM}" in table.stdout and 'data.mode: "fast" → "slow"' in table.stdout
    assert "data.password: changed (sensitive)" in table.stdout
    assert "context.env.TOKEN: changed (sensitive)" in table.stdout

    # backwards: the same changes the other way round
    back = json.loads(
        invoke(home, "release", "diff", "-p", "p", "-w", "w", "2", "1", "-o", "json").stdout
    )
    [cm] = [r for r in back["state"]["resources"] if r["id"] == CM]
    assert cm["fields"][0]["old"] == "slow" and cm["fields"][0]["new"] == "fast"


@pytest.mark.usefixtures("two")
def test_release_diff_of_a_revision_with_itself_is_empty(home: Path) -> None:
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "2", "2", "-o", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["spec"]["resources"] == [] and data["state"]["resources"] == []
    assert data["spec"]["fields"] == [] and data["state"]["summary"]["unchanged"] == 4
    table = invoke(home, "release", "diff", "-p", "p", "-w", "w", "1", "1")
    assert table.exit_code == 0 and "no changes" in table.stdout


def test_release_diff_of_what_does_not_exist_is_one_line(home: Path, store: StateBackend) -> None:
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "1", "2")
    assert result.exit_code == NotFoundError.exit_code
    assert result.stderr == "Error: stack p/w has no releases\n"
    _release(store, "fast", OLD_PW, OLD_TOKEN)
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "1", "7")
    assert result.exit_code == NotFoundError.exit_code and result.stdout == ""
    assert result.stderr == "Error: release 7 of p/w does not exist (revisions 1)\n"
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "0", "1", "-o", "json")
    assert result.exit_code == 2  # no release can be 0: bad input
    assert result.stderr == "Error: path.old: Input should be greater than or equal to 1\n"


@pytest.mark.usefixtures("two")
def test_release_diff_without_the_keys_is_one_clear_line(home: Path) -> None:
    result = invoke(home, "release", "diff", "-p", "p", "-w", "w", "1", "2", keys=False)
    assert result.exit_code == SpecError.exit_code
    assert result.stderr.count("\n") == 1 and "no keys" in result.stderr
    _no_secret(result)


@pytest.mark.usefixtures("two")
def test_output_of_one_recorded_value(home: Path) -> None:
    flags = ("-p", "p", "-w", "w")
    plain = invoke(home, "output", *flags, f"{CM}.data.mode")
    assert plain.exit_code == 0, plain.stderr
    assert plain.stdout == "slow\n" and plain.stderr == ""
    assert invoke(home, "output", *flags, f"{CM}.x.1").stdout == "2\n"
    as_json = invoke(home, "output", *flags, f"{CM}.data.mode", "-o", "json")
    assert json.loads(as_json.stdout) == "slow"
    whole = json.loads(invoke(home, "output", *flags, f"{CM}.data", "-o", "json").stdout)
    assert whole == {"mode": "slow"}
    resource = json.loads(invoke(home, "output", *flags, CM, "-o", "json").stdout)
    assert resource["kind"] == "ConfigMap" and resource["x"] == [1, 2]

    # sensitive: masked (a note on stderr), unless --show-sensitive
    for target in (f"{SECRET}.data.password", f"{PW}.result", f"{COPY}.content"):
        masked = invoke(home, "output", *flags, target)
        assert masked.exit_code == 0, masked.stderr
        assert masked.stdout == "(sensitive value)\n" and "--show-sensitive" in masked.stderr
        _no_secret(masked)
    masked_whole = json.loads(invoke(home, "output", *flags, SECRET, "-o", "json").stdout)
    assert masked_whole["data"] == "(sensitive value)"
    shown = invoke(home, "output", *flags, f"{SECRET}.data.password", "--show-sensitive")
    assert shown.stdout == b64(NEW_PW) + "\n"
    shown = invoke(home, "output", *flags, f"{COPY}.content", "--show-sensitive", "-o", "json")
    assert json.loads(shown.stdout) == NEW_PW

    # the table of every resource is masked the same way (taint included) and --resource works
    every = invoke(home, "output", *flags)
    assert every.exit_code == 0
    _no_secret(every)
    assert set(json.loads(every.stdout)) == {CM, SECRET, PW, COPY}
    only = json.loads(invoke(home, "output", *flags, "--resource", COPY).stdout)
    assert only == {COPY: {"kind": "File", "path": "/tmp/motd", "content": "(sensitive value)"}}


@pytest.mark.usefixtures("two")
def test_output_of_what_is_not_recorded_is_one_line(home: Path) -> None:
    flags = ("-p", "p", "-w", "w")
    missing = invoke(home, "output", *flags, "v1:ConfigMap:ns:other.data")
    assert missing.exit_code == NotFoundError.exit_code and missing.stdout == ""
    assert missing.stderr == (
        "Error: v1:ConfigMap:ns:other.data: no such resource in release 2 of p/w\n"
    )
    no_path = invoke(home, "output", *flags, f"{CM}.data.nope")
    assert no_path.exit_code == NotFoundError.exit_code
    assert no_path.stderr == f"Error: {CM}: no field data.nope in release 2 of p/w\n"
    both = invoke(home, "output", *flags, CM, "--resource", CM)
    assert both.exit_code == SpecError.exit_code and "not both" in both.stderr
    none = invoke(home, "output", "-p", "other", CM)
    assert none.exit_code == NotFoundError.exit_code
    assert none.stderr == "Error: stack other/default has no releases\n"


@pytest.mark.usefixtures("two")
def test_output_without_keys_masks_and_refuses_to_show_sealed_values(home: Path) -> None:
    flags = ("-p", "p", "-w", "w")
    masked = invoke(home, "output", *flags, f"{SECRET}.data", keys=False)
    assert masked.exit_code == 0 and masked.stdout == "(sensitive value)\n", masked.stderr
    refused = invoke(home, "output", *flags, f"{SECRET}.data", "--show-sensitive", keys=False)
    assert refused.exit_code == 2 and "no encryption keys" in refused.stderr
    assert refused.stdout == ""
    plain = invoke(home, "output", *flags, f"{CM}.data.mode", keys=False)
    assert plain.stdout == "slow\n"
