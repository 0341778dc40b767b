"""A process without encryption keys that receives encrypted payloads says so, once."""

from __future__ import annotations

import logging

import pytest
from temporalio.api.common.v1 import Payload

import stackflow.temporal.codec as codec
from stackflow.core.crypto import KeyRing, new_key_line
from stackflow.temporal.codec import ENCRYPTED, payload_codec

KEY = new_key_line("k9")


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY_FILE", raising=False)
    monkeypatch.setattr(codec, "_warned_no_key", False)


async def encrypted() -> list[Payload]:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"password": "hunter2"}')
    return list(await payload_codec(KeyRing.parse(KEY, "test")).encode([plain]))


async def test_one_clear_line_without_the_key_material(caplog: pytest.LogCaptureFixture) -> None:
    payloads = await encrypted()
    no_keys = payload_codec()
    with caplog.at_level(logging.INFO, logger="stackflow.temporal.codec"):
        for _ in range(3):
            [same] = await no_keys.decode(payloads)
            assert same.metadata["encoding"] == ENCRYPTED  # passed on as it is
    [record] = [r for r in caplog.records if r.name == "stackflow.temporal.codec"]
    message = record.getMessage()
    assert record.levelno == logging.ERROR
    assert "key 'k9'" in message and "STACKFLOW_ENCRYPTION_KEY" in message
    assert KEY.split(":", 1)[1] not in message and "hunter2" not in message


async def test_silent_with_the_key_and_for_plain_payloads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    payloads = await encrypted()
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"{}")
    with caplog.at_level(logging.INFO, logger="stackflow.temporal.codec"):
        [opened] = await payload_codec(KeyRing.parse(KEY, "test")).decode(payloads)
        assert opened.data == b'{"password": "hunter2"}'
        await payload_codec().decode([plain])
    assert not [r for r in caplog.records if r.name == "stackflow.temporal.codec"]


async def test_reading_a_payload_sealed_under_a_key_not_here_is_one_line() -> None:
    """A client without the keys (the CLI in direct mode) reading a worker's encrypted query
    result: one EncryptionKeyError line (exit 2) naming the key id and the variables, where
    the SDK's converter raised ``KeyError: 'Unknown payload encoding binary/encrypted'``."""
    from stackflow.core.crypto import EncryptionKeyError
    from stackflow.temporal.codec import data_converter

    converter = data_converter()  # no keys in the environment
    [sealed] = await converter.payload_codec.decode(await encrypted())  # type: ignore[union-attr]
    for hints in (None, [dict]):
        with pytest.raises(EncryptionKeyError) as caught:
            converter.payload_converter.from_payloads([sealed], hints)
        message = str(caught.value)
        assert "key 'k9'" in message and "STACKFLOW_ENCRYPTION_KEY" in message
        assert "\n" not in message and caught.value.exit_code == 2
        assert KEY.split(":", 1)[1] not in message and "hunter2" not in message
