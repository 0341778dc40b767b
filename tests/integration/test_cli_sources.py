"""`stackflow source set|show|unset` and `stackflow notify add|list|remove` (issue 22), the real
console script in both modes: through the dev API (`make up`'s `stackflow serve`, the
address and token `make -s env` exports: tests/conftest.py's DEV_API), with no Temporal
address, state URL or encryption key in the CLI's environment; and directly against a state
backend (SQLite, PostgreSQL). A secret goes in on stdin or in a file and comes out nowhere;
bad input is exit 2 with one line, and binds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from stackflow.model.notifications import TYPES
from tests.integration.conftest import require_env, run_cli
from tests.integration.opshelp import DIRECT_ONLY, new_project

pytestmark = pytest.mark.integration

URL = "https://git.example.com/acme/infra.git"
HOOK = "https://hooks.example.com/stackflow"


def dev_api() -> dict[str, str]:
    from tests.conftest import DEV_API

    if set(DEV_API) != {"STACKFLOW_API_URL", "STACKFLOW_API_TOKEN"}:
        pytest.fail(
            "STACKFLOW_API_URL and STACKFLOW_API_TOKEN are not set: start the services with "
            '`make up` and `eval "$(make -s env)"` (or run `make test`)',
            pytrace=False,
        )
    return dict(DEV_API)


@pytest.fixture
def api_env(tmp_path: Path) -> dict[str, str]:
    """The CLI as a laptop in API mode runs it: the dev API's address and token only."""
    env = {k: v for k, v in os.environ.items() if k not in DIRECT_ONLY}
    (tmp_path / "laptop").mkdir()
    return {**env, "STACKFLOW_HOME": str(tmp_path / "laptop"), **dev_api()}


@pytest.fixture(params=["sqlite", "postgresql"])
def direct_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The CLI in direct mode on a state backend of its own, with the dev encryption key."""
    require_env("STACKFLOW_ENCRYPTION_KEY_FILE")
    env = dict(os.environ, STACKFLOW_HOME=str(tmp_path / "home"))
    if request.param == "sqlite":
        env["STACKFLOW_STATE_URL"] = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        env["STACKFLOW_STATE_URL"] = request.getfixturevalue("integration_postgres_url")
        ok(run_cli(env, "state", "migrate"))
    return env


def ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc).stdout)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The command ended with ``code`` and said why in one line on stderr, nothing else."""
    ok(proc, code)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert proc.stdout == "", proc.stdout
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def secret() -> str:
    return f"sf-secret-{uuid.uuid4().hex}"


Said = tuple[list[str], list[str]]
"""What the CLI printed (stdout and stderr of each call), and the secrets it was given."""


def source_flow(env: dict[str, str], tmp_path: Path) -> Said:
    """Set (secret on stdin), show, set again (secret in a file), unset."""
    project, given = new_project(), [secret(), secret()]
    stack = ["-p", project, "-w", "dev"]
    where = ["--url", URL, "--ref", "main", "--path", "deploy/spec.yaml"]
    bound = as_json(
        run_cli(
            env,
            "source",
            "set",
            *stack,
            *where,
            "--on-push",
            "preview",
            "--auto-approve",
            "-o",
            "json",
            input=given[0] + "\n",
        )
    )
    expected = {
        "project": project,
        "workspace": "dev",
        "url": URL,
        "ref": "main",
        "path": "deploy/spec.yaml",
        "on_push": "preview",
        "auto_approve": True,
    }
    assert bound == expected
    shown = [run_cli(env, "source", "show", *stack, "-o", "json")]
    assert as_json(shown[0]) == expected
    shown.append(ok(run_cli(env, "source", "show", *stack)))
    assert URL in shown[-1].stdout and "preview" in shown[-1].stdout

    secret_file = tmp_path / f"{project}.secret"
    secret_file.write_text(given[1] + "\n")
    again = run_cli(
        env, "source", "set", *stack, *where, "--secret-file", str(secret_file), "-o", "json"
    )
    assert as_json(again) == {**expected, "on_push": "apply", "auto_approve": False}
    shown += [again, ok(run_cli(env, "source", "unset", *stack))]
    assert "git source removed" in shown[-1].stdout
    one_line(run_cli(env, "source", "show", *stack), 1, "has no git source")
    one_line(run_cli(env, "source", "unset", *stack), 1, "has no git source")
    return [p.stdout + p.stderr for p in shown], given


def notify_flow(env: dict[str, str], tmp_path: Path) -> Said:
    """Add two destinations (stdin, a file), list them, replace one, remove one."""
    project, given = new_project(), [secret(), secret(), secret()]
    p = ["-p", project]
    ops = as_json(
        run_cli(
            env,
            "notify",
            "add",
            *p,
            "--name",
            "ops",
            "--url",
            f"{HOOK}/ops",
            "--type",
            "run.failed",
            "--type",
            "io.stackflow.run.awaiting_approval",
            "-o",
            "json",
            input=given[0],
        )
    )
    assert ops == {
        "project": project,
        "name": "ops",
        "url": f"{HOOK}/ops",
        "types": ["io.stackflow.run.failed", "io.stackflow.run.awaiting_approval"],
    }
    secret_file = tmp_path / f"{project}.secret"
    secret_file.write_text(given[1])
    chat = ["--name", "chat", "--url", f"{HOOK}/chat", "--secret-file", str(secret_file)]
    out = [ok(run_cli(env, "notify", "add", *p, *chat))]
    assert "chat" in out[0].stdout and "all" in out[0].stdout
    listed = as_json(run_cli(env, "notify", "list", *p, "-o", "json"))
    assert [(t["name"], t["url"]) for t in listed] == [
        ("ops", f"{HOOK}/ops"),
        ("chat", f"{HOOK}/chat"),
    ]
    assert listed[1]["types"] == list(TYPES)  # all, when no --type is given
    # replaced in its place
    moved = ["--name", "ops", "--url", f"{HOOK}/ops2", "-o", "json"]
    replaced = as_json(run_cli(env, "notify", "add", *p, *moved, input=given[2]))
    assert replaced["url"] == f"{HOOK}/ops2" and replaced["types"] == list(TYPES)
    out.append(ok(run_cli(env, "notify", "list", *p)))
    table = out[-1].stdout
    assert table.index("ops") < table.index("chat") and f"{HOOK}/ops2" in table.replace("\n", "")

    out.append(ok(run_cli(env, "notify", "remove", *p, "--name", "ops")))
    assert "removed" in out[-1].stdout
    assert [t["name"] for t in as_json(run_cli(env, "notify", "list", *p, "-o", "json"))] == [
        "chat"
    ]
    one_line(run_cli(env, "notify", "remove", *p, "--name", "ops"), 1, "no notification")
    return [o.stdout + o.stderr for o in out], given


def nothing_secret(*said: Said) -> list[str]:
    """No secret given is in anything printed; the secrets."""
    printed = [text for texts, _ in said for text in texts]
    secrets = [s for _, given in said for s in given]
    for text in printed:
        assert not [s for s in secrets if s in text], text
    return secrets


def bad_inputs(env: dict[str, str], tmp_path: Path) -> None:
    """Each is exit 2 with one line naming what is wrong, and binds nothing."""
    project, good = new_project(), secret()
    stack = ["-p", project, "-w", "dev"]
    where = ["--url", URL, "--path", "deploy/spec.yaml"]

    def source_set(*args: str, input: str = good) -> subprocess.CompletedProcess[str]:
        return run_cli(env, "source", "set", *stack, *args, input=input)

    one_line(source_set(*where, input=""), 2, "secret is empty")
    one_line(source_set(*where, input="\n"), 2, "secret is empty")
    empty = tmp_path / "empty"
    empty.write_text("")
    one_line(source_set(*where, "--secret-file", str(empty)), 2, "secret is empty", "--secret-file")
    short = "too-short"
    assert short not in one_line(source_set(*where, input=short), 2, "the secret", "16")
    one_line(source_set("--url", "ftp://git.example.com/x", "--path", "s.yaml"), 2, "--url")
    one_line(source_set("--url", "https://u:p@git.example.com/x", "--path", "s.yaml"), 2, "--url")
    one_line(source_set("--url", URL, "--path", "../s.yaml"), 2, "--path")
    one_line(source_set(*where, "--on-push", "destroy"), 2, "--on-push")
    one_line(source_set(*where, "--ref", "main; rm"), 2, "--ref")
    one_line(run_cli(env, "source", "show", "-p", "bad name"), 2, "--project")
    one_line(run_cli(env, "source", "show", *stack), 1, "has no git source")

    def notify_add(*args: str, input: str = good) -> subprocess.CompletedProcess[str]:
        return run_cli(env, "notify", "add", "-p", project, *args, input=input)

    hook = ["--name", "x", "--url", HOOK]
    one_line(notify_add(*hook, "--type", "run.nope"), 2, "unknown type 'run.nope'")
    one_line(notify_add("--name", "x", "--url", "ftp://h/x"), 2, "--url")
    one_line(notify_add("--name", "x", "--url", "not a url"), 2, "--url")
    one_line(notify_add(*hook, input=""), 2, "secret is empty")
    one_line(notify_add("--name", "a b", "--url", HOOK), 2, "--name")
    one_line(notify_add("--name", "failed", "--url", HOOK), 2, "reserved")
    assert as_json(run_cli(env, "notify", "list", "-p", project, "-o", "json")) == []


def test_sources_and_destinations_through_the_dev_api(
    api_env: dict[str, str], tmp_path: Path
) -> None:
    nothing_secret(source_flow(api_env, tmp_path), notify_flow(api_env, tmp_path))
    bad_inputs(api_env, tmp_path)

    # what the API itself answers: on_push, never the secret; `mode` still accepted
    api = dev_api()
    project = new_project()
    headers = {"Authorization": f"Bearer {api['STACKFLOW_API_TOKEN']}"}
    path = f"/v1/stacks/{project}/dev/source"
    with httpx.Client(base_url=api["STACKFLOW_API_URL"], headers=headers, timeout=60) as http:
        value = secret()
        body = {"url": URL, "path": "s.yaml", "secret": value, "mode": "preview"}
        r = http.put(path, json=body)
        assert r.status_code == 200 and r.json()["on_push"] == "preview", r.text
        shown = ok(run_cli(api_env, "source", "show", "-p", project, "-w", "dev", "-o", "json"))
        assert json.loads(shown.stdout)["on_push"] == "preview" and value not in shown.stdout
        assert value not in http.get(path).text + r.text
        assert http.delete(path).status_code == 204


def test_sources_and_destinations_directly(direct_env: dict[str, str], tmp_path: Path) -> None:
    secrets = nothing_secret(source_flow(direct_env, tmp_path), notify_flow(direct_env, tmp_path))
    bad_inputs(direct_env, tmp_path)
    state = tmp_path / "state.db"
    if state.exists():  # SQLite: the secrets are sealed at rest (the dev key is configured)
        raw = b"".join(p.read_bytes() for p in tmp_path.glob("state.db*"))
        assert all(s.encode() not in raw for s in secrets)
