"""A value a runtime computes from a secret is a secret: a ``random_password`` result handed
through ``$kusion_path`` to ``terraform_data.input`` comes back as ``terraform_data.output``
(computed by OpenTofu, not tainted by any reference). Through preview, apply (a batch of two
``terraform_data`` and a ``random_string`` alone), a password rotation, release show, output
and destroy, neither password is found in the CLI's text or JSON, the decoded Temporal
histories, any Redis value, the SQLite database, its WAL and shared-memory files (read while
the worker still has them open), any other file under STACKFLOW_HOME or the worker log."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from stackflow.core.crypto import KeyRing
from stackflow.core.refs import StackRef
from stackflow.engine.masking import SENSITIVE_MARKER
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.terraform import SENSITIVE_KEY, STATE_KEY, TerraformRuntime
from stackflow.runtimes.terraform.state import instance, state_sensitive_paths
from stackflow.state.backend import open_backend
from tests.integration.conftest import WorkerProcess, run_cli

RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"
BUILTIN = "terraform.io/builtin/terraform"
PW = "hashicorp:random:random_password:pw"
COPY = "builtin:terraform:terraform_data:copy"
COPY2 = "builtin:terraform:terraform_data:copy2"
KEEPER = "hashicorp:random:random_string:keeper"


@pytest.fixture
def state_kind() -> str:
    return "sqlite"  # the database, its WAL and SHM files live in the test's home


def _spec(length: int, note: Path) -> dict[str, Any]:
    result = f"$kusion_path.{PW}.result"
    return {
        "resources": [
            {
                "id": PW,
                "type": "Terraform",
                "attributes": {"length": length, "special": False},
                "extensions": {"provider": RANDOM, "resourceType": "random_password"},
            },
            {
                "id": COPY,
                "type": "Terraform",
                "attributes": {"input": result},
                "extensions": {"provider": BUILTIN},
            },
            {
                "id": COPY2,
                "type": "Terraform",
                "attributes": {"input": {"password": result, "user": "app"}},
                "extensions": {"provider": BUILTIN},
            },
            {
                "id": KEEPER,
                "type": "Terraform",
                "attributes": {"length": 12, "special": False, "keepers": {"pw": result}},
                "extensions": {"provider": RANDOM, "resourceType": "random_string"},
            },
            {
                # taint follows the derived value: the file takes the computed output
                "id": f"onprem:File:{note}",
                "type": "OnPrem",
                "attributes": {
                    "kind": "File",
                    "path": str(note),
                    "content": f"$kusion_path.{COPY}.output",
                },
            },
        ]
    }


def _payloads(message: Message) -> Iterator[Payload]:
    """Every Payload inside a history event, wherever it sits."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if isinstance(value, Message):
            items = [value]
        elif hasattr(value, "values"):  # a map field
            items = list(value.values())
        else:  # a repeated field
            items = list(value)
        for item in items:
            if isinstance(item, Payload):
                yield item
            elif isinstance(item, Message):
                yield from _payloads(item)


async def _history_texts(client: Client, project: str) -> list[tuple[str, str]]:
    """Each run's history of the stack, every payload decoded (decrypted, decompressed)."""
    codec = client.data_converter.payload_codec
    assert codec is not None, "the dev loop encrypts payloads"
    out: list[tuple[str, str]] = []
    async for run in client.list_workflows(f'WorkflowId STARTS_WITH "stackflow/{project}/"'):
        history = await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
        raw = [p for event in history.events for p in _payloads(event)]
        decoded = await codec.decode(raw)
        assert len(decoded) == len(raw)
        texts = [p.data.decode(errors="replace") for p in decoded]
        out.append(
            (f"{run.id}/{run.run_id}", json.dumps(history.to_json_dict()) + "\n".join(texts))
        )
    return out


def _redis_values(url: str) -> Iterator[tuple[str, str]]:
    cache = redis.Redis.from_url(url, decode_responses=False)
    for key in cache.scan_iter(count=1000):
        kind = _text(cache.type(key))
        if kind == "string":
            value: Any = cache.get(key)
        elif kind == "hash":
            value = cache.hgetall(key)
        elif kind == "list":
            value = cache.lrange(key, 0, -1)
        elif kind == "set":
            value = cache.smembers(key)
        elif kind == "zset":
            value = cache.zrange(key, 0, -1)
        elif kind == "stream":
            value = cache.xrange(key)
        else:
            value = b""
        yield _text(key), repr(value)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


async def test_a_value_computed_from_a_secret_is_found_nowhere(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client, tf_bin: str
) -> None:
    env = stack_env
    assert env.get("STACKFLOW_ENCRYPTION_KEY_FILE"), "the dev loop encrypts"
    home = Path(env["STACKFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    worker = WorkerProcess(home, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    project = f"derived{uuid.uuid4().hex[:8]}"
    flags = ("-p", project)
    note = tmp_path / "outside-home" / "note"
    spec_file = tmp_path / "spec.yaml"
    outputs: list[str] = []
    passwords: list[str] = []

    def cli(*args: str) -> str:
        proc = run_cli(env, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout + proc.stderr)
        return proc.stdout

    def secret(path: str) -> Any:
        shown = run_cli(env, "output", *flags, path, "--show-sensitive", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)

    db = home / "state.db"
    at_rest: list[tuple[str, bytes]] = []
    cached: list[tuple[str, str]] = []

    try:
        for length in (24, 28):  # apply, then rotate the password (every copy changes)
            spec_file.write_text(yaml.safe_dump(_spec(length, note)))
            cli("preview", "-f", str(spec_file), *flags)
            cli("preview", "-f", str(spec_file), *flags, "-o", "json")
            cli("apply", "-f", str(spec_file), *flags, "--yes", "-o", "json")
            cli("apply", "-f", str(spec_file), *flags, "--yes")  # nothing to change
            cli("preview", "-f", str(spec_file), *flags, "-o", "json")
            cli("release", "show", *flags, "-o", "json")
            cli("release", "show", *flags, "--diff")
            cli("output", *flags)
            cli("output", *flags, "-o", "table")
            cli("output", *flags, f"{COPY}.output")
            cli("output", *flags, f"{COPY2}.output", "-o", "json")
            cli("release", "diff", *flags, "1", str(len(passwords) * 2 + 1))
            password = secret(f"{PW}.result")
            assert isinstance(password, str) and len(password) == length
            passwords.append(password)
            # the derived values are there, sealed at rest and masked unless asked for
            assert secret(f"{COPY}.output") == password
            assert secret(f"{COPY2}.output") == {"password": password, "user": "app"}
            assert note.read_text() == password
            masked = run_cli(env, "output", *flags, f"{COPY}.output")
            assert masked.stdout.strip() == SENSITIVE_MARKER, masked.stdout
            masked = run_cli(env, "output", *flags, f"onprem:File:{note}.content")
            assert masked.stdout.strip() == SENSITIVE_MARKER, masked.stdout
            # a plain copy of a plain input stays readable
            plain = run_cli(env, "output", *flags, f"{COPY2}.input.user")
            assert plain.stdout.strip() == "app", plain.stdout + plain.stderr
        # OpenTofu was told: its own state marks the tainted input sensitive
        keys = KeyRing.from_env()
        backend = open_backend(env["STACKFLOW_STATE_URL"], keys=keys)
        try:
            states = backend.get_terraform_states(StackRef(project, "default"), [COPY, COPY2])
        finally:
            backend.close()
        for rid in (COPY, COPY2):
            inst = instance(json.loads(states[rid]))
            assert inst is not None
            assert any(p.startswith("input") for p in state_sensitive_paths(inst, None)), rid
        # the WAL and SHM files exist while the worker has the database open
        for path in sorted(home.glob("state.db*")):
            at_rest.append((path.name, path.read_bytes()))
        assert {name for name, _ in at_rest} >= {"state.db", "state.db-wal"}
        # Redis holds the latest release's state now (the destroy's release replaces it)
        cached = list(_redis_values(env["REDIS_URL"]))
        assert any(project in key for key, _ in cached)
        cli("destroy", *flags, "--yes", "-o", "json")
        cli("release", "show", *flags, "-o", "json")
    finally:
        worker.stop()
    planted = [
        form
        for pw in passwords
        for form in (pw, base64.b64encode(pw.encode()).decode(), json.dumps(pw)[1:-1])
    ]
    assert len(passwords) == 2 and passwords[0] != passwords[1]

    def leaks(where: str, text: str) -> None:
        found = [p for p in planted if p in text]
        assert not found, f"{where} holds a password in clear"

    for number, text in enumerate(outputs):
        leaks(f"CLI output #{number}", text)
    for name, body in at_rest:
        leaks(f"{name} (during the run)", body.decode(errors="replace"))
    assert db.is_file()
    for path in home.rglob("*"):
        if path.is_file():  # the database and its WAL after the run, the worker log, tofu dirs
            leaks(str(path), path.read_bytes().decode(errors="replace"))
    for key, value in [*cached, *_redis_values(env["REDIS_URL"])]:
        leaks(f"redis {key}", value)
    histories = await _history_texts(temporal_client, project)
    assert len(histories) >= 5  # previews, applies, destroy
    for where, text in histories:
        leaks(f"history {where}", text)


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
async def test_tainted_values_reach_opentofu_as_sensitive(
    tmp_path: Path, tf_bin: str, batched: bool
) -> None:
    """The runtime hands a tainted value to OpenTofu as a sensitive variable, alone (no state
    backend: each resource its own command) and in a batch (two resources, one command): the
    state OpenTofu writes marks it, the plan marks it, and no file it leaves holds it."""
    password = f"pw-{uuid.uuid4().hex}"
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}") if batched else None
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    batches: list[int] = []
    command = runtime._batch_command

    async def counted(calls: Any) -> bool:
        batches.append(len(calls))
        return await command(calls)

    runtime._batch_command = counted  # type: ignore[method-assign]
    options = RuntimeOptions(project="p", workspace="w", timeout_seconds=120)
    requests = [
        ResourceRequest(
            id=f"builtin:terraform:terraform_data:d{i}",
            type="Terraform",
            attributes={"input": {"pw": password, "n": i}},
            extensions={"provider": BUILTIN},
            sensitive_paths=["input.pw"],
        )
        for i in range(2)
    ]
    try:
        lives = await asyncio.gather(*(runtime.apply(r, options) for r in requests))
        assert batches == ([2] if batched else [])
        for live in lives:
            assert live["output"]["pw"] == password  # the computed copy OpenTofu did not mark
            assert "input.pw" in live[SENSITIVE_KEY]
            inst = instance(json.loads(live[STATE_KEY]))
            assert inst is not None and "input.pw" in state_sensitive_paths(inst, None)
        again = [
            r.model_copy(update={"prior_state": live})
            for r, live in zip(requests, lives, strict=True)
        ]
        previews = await asyncio.gather(*(runtime.preview(r, options) for r in again))
        for result in previews:
            assert "input.pw" in result.sensitive_paths
        if batched:  # with a backend nothing holding values stays between commands
            for path in (tmp_path / "tf").rglob("*"):
                if path.is_file():
                    assert password not in path.read_bytes().decode(errors="replace"), path
        await asyncio.gather(*(runtime.delete(r, options) for r in again))
    finally:
        if backend is not None:
            backend.close()
