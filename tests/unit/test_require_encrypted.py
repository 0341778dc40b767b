"""``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS``: a worker that requires encrypted input refuses a
run's or an Update's arguments that arrived unencrypted (one non-retryable InvalidInput line:
the run fails, never its workflow task), whatever metadata a client without the keys puts on
them; encrypted input, and typed decoding of the worker's own payloads, pass as before."""

from __future__ import annotations

import os

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError

from stackflow.core.crypto import EncryptionKeyError, KeyRing, new_key_line
from stackflow.temporal.codec import (
    ENCODING,
    ENCRYPTED,
    UNENCRYPTED,
    data_converter,
    require_encrypted_from_env,
)
from stackflow.temporal.operation import ApprovalInput
from stackflow.worker.main import WorkerSettings, check

KEYS = KeyRing.parse(new_key_line("k1"), "test")
STRICT = data_converter(KEYS, require_encrypted=True)
LAX = data_converter(KEYS)


async def arrive(converter: object, payloads: list[Payload]) -> list[Payload]:
    """What a worker's workflow code is handed: the payloads through the codec."""
    codec = converter.payload_codec  # type: ignore[attr-defined]
    return list(await codec.decode(payloads))


def plain(data: bytes = b'{"by": "mallory"}', **meta: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain", **meta}, data=data)


async def test_plain_json_input_is_refused_with_one_line() -> None:
    [seen] = await arrive(STRICT, [plain()])
    with pytest.raises(ApplicationError) as caught:
        STRICT.payload_converter.from_payloads([seen])
    err = caught.value
    assert err.type == "InvalidInput" and err.non_retryable
    assert err.message.startswith(
        "invalid input: argument 1 is not encrypted, and this worker refuses unencrypted "
        "input (STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1)"
    )
    assert "--codec-endpoint" in err.message and "\n" not in err.message


async def test_encrypted_input_passes_and_the_mark_cannot_be_forged_away() -> None:
    [sent] = await STRICT.encode([ApprovalInput(by="ann")])
    assert sent.metadata["encoding"] == ENCRYPTED
    [seen] = await arrive(STRICT, [sent])
    assert UNENCRYPTED not in seen.metadata
    assert STRICT.payload_converter.from_payloads([seen]) == [{"by": "ann", "reason": None}]
    # a client without the keys: whatever it claims in the metadata, it is marked
    for forged in (
        plain(**{UNENCRYPTED: b"0"}),
        plain(**{"encryption-key-id": b"k1"}),
        Payload(metadata={"encoding": ENCODING}, data=b"not zlib"),  # "compressed"
    ):
        [seen] = await arrive(STRICT, [forged])
        assert seen.metadata[UNENCRYPTED] == b"1"
        with pytest.raises(ApplicationError):
            STRICT.payload_converter.from_payloads([seen])


async def test_the_second_of_two_arguments_is_named() -> None:
    [good] = await STRICT.encode([{"by": "ann"}])
    seen = await arrive(STRICT, [good, plain()])
    with pytest.raises(ApplicationError) as caught:
        STRICT.payload_converter.from_payloads(seen)
    assert caught.value.message.startswith("invalid input: argument 2 is not encrypted")


async def test_typed_decoding_and_the_lax_worker_are_unchanged() -> None:
    [seen] = await arrive(STRICT, [plain()])
    assert STRICT.payload_converter.from_payloads([seen], [ApprovalInput]) == [
        ApprovalInput(by="mallory")
    ]
    [lax] = await arrive(LAX, [plain()])
    assert UNENCRYPTED not in lax.metadata
    assert LAX.payload_converter.from_payloads([lax]) == [{"by": "mallory"}]


async def test_the_mark_never_leaves_the_process() -> None:
    [seen] = await arrive(STRICT, [plain()])
    # a payload the worker passes on as it is (a raw value): encoded without the mark
    [again] = await STRICT.payload_codec.encode([seen])  # type: ignore[union-attr]
    assert again.metadata["encoding"] == ENCRYPTED
    [back] = await LAX.payload_codec.decode([again])  # type: ignore[union-attr]
    assert UNENCRYPTED not in back.metadata and back.data == b'{"by": "mallory"}'


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS", raising=False)
    assert require_encrypted_from_env() is False
    for on in ("1", "true", "on"):
        monkeypatch.setenv("STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS", on)
        assert require_encrypted_from_env() is True
    monkeypatch.setenv("STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS", "sure")
    with pytest.raises(EncryptionKeyError, match="'sure': use 1 or 0"):
        require_encrypted_from_env()


def test_a_worker_requiring_encryption_without_keys_does_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith(("STACKFLOW_ENCRYPTION_KEY", "TEMPORAL_TLS", "STACKFLOW_POLICY")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS", "1")
    settings = WorkerSettings.from_env()
    assert settings.require_encrypted
    with pytest.raises(EncryptionKeyError) as err:
        check(settings, None)
    assert str(err.value).startswith(
        "STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1 needs the payload keys: set "
        "STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE"
    )
    assert err.value.exit_code == 2
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", new_key_line("k1"))
    check(settings, None)  # with keys it starts
