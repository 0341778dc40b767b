"""`stackflow keys new`: the key line compose's STACKFLOW_ENCRYPTION_KEY takes."""

from __future__ import annotations

import asyncio
import re

from typer.testing import CliRunner

from stackflow.cli.app import app
from stackflow.cli.main import load_commands
from stackflow.core.crypto import KeyRing
from stackflow.temporal.codec import data_converter


def keys_new(*args: str) -> tuple[int, str]:
    load_commands()
    result = CliRunner().invoke(app, ["keys", "new", *args])
    return result.exit_code, result.output


def test_a_new_key_is_a_working_32_byte_key_under_its_id() -> None:
    code, out = keys_new("--id", "prod-2")
    assert code == 0, out
    line = out.strip()
    ring = KeyRing.parse(line, "test")
    assert ring.current == "prod-2" and len(ring.keys["prod-2"]) == 32

    async def round_trip() -> object:
        converter = data_converter(ring)
        return await converter.decode(await converter.encode(["hello"]), [str])

    assert asyncio.run(round_trip()) == ["hello"]


def test_every_key_is_fresh_and_the_default_id_is_k1() -> None:
    lines = {keys_new()[1].strip() for _ in range(3)}
    assert len(lines) == 3
    assert all(line.startswith("k1:") for line in lines)


def test_a_bad_id_is_bad_input() -> None:
    code, out = keys_new("--id", "no spaces")
    assert code == 2
    assert "key id 'no spaces' must be letters" in out
    assert not re.search(r"[A-Za-z0-9+/]{43}=", out), "no key printed with a bad id"
