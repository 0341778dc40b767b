"""Arguments that are not JSON at all: the data converter refuses a payload it cannot decode
without a type (a workflow's or an Update's arguments) with one non-retryable InvalidInput
line, so the run fails instead of its workflow task; typed decoding and encrypted payloads
a process has no key for fail as before."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError

from stackflow.core.crypto import EncryptionKeyError
from stackflow.temporal.codec import ENCRYPTED, CompressionCodec, data_converter
from stackflow.temporal.operation import OperationInput

CONVERTER = data_converter().payload_converter


def payload(encoding: bytes, data: bytes, **meta: bytes) -> Payload:
    return Payload(metadata={"encoding": encoding, **meta}, data=data)


@pytest.mark.parametrize(
    ("sent", "line"),
    [
        (
            payload(b"acme/custom", b"{}"),
            "invalid input: argument 1 cannot be decoded (encoding 'acme/custom'): not an "
            "encoding stackflow reads; send JSON (json/plain)",
        ),
        (
            payload(b"json/plain", b"{project: x"),
            "invalid input: argument 1 cannot be decoded (encoding 'json/plain'): Invalid "
            "JSON: key must be a string at line 1 column 2; send JSON (json/plain)",
        ),
        (
            payload(b"json/protobuf", b"{}", messageType=b"acme.v1.Input"),
            "invalid input: argument 1 cannot be decoded (encoding 'json/protobuf'): Unknown "
            "Protobuf type acme.v1.Input; send JSON (json/plain)",
        ),
        (
            payload(b"binary/null", b"x"),
            "invalid input: argument 1 cannot be decoded (encoding 'binary/null'): Expected "
            "empty data set for binary/null; send JSON (json/plain)",
        ),
    ],
)
def test_an_argument_that_cannot_be_decoded_is_invalid_input(sent: Payload, line: str) -> None:
    with pytest.raises(ApplicationError) as caught:
        CONVERTER.from_payloads([sent])
    assert caught.value.type == "InvalidInput" and caught.value.non_retryable
    assert caught.value.message == line and caught.value.__cause__ is None


def test_the_argument_that_fails_is_named_and_the_encoding_capped() -> None:
    good = payload(b"json/plain", b'{"project": "p"}')
    with pytest.raises(ApplicationError) as caught:
        CONVERTER.from_payloads([good, payload(b"x" * 10_000, b"")])
    assert caught.value.message.startswith(
        "invalid input: argument 2 cannot be decoded (encoding '" + "x" * 40 + "')"
    )
    assert len(caught.value.message) < 200


def test_typed_decoding_fails_as_before() -> None:
    with pytest.raises(ValidationError):
        CONVERTER.from_payloads([payload(b"json/plain", b"{nope")], [OperationInput])
    with pytest.raises(KeyError):
        CONVERTER.from_payloads([payload(b"acme/custom", b"{}")], [OperationInput])


def test_an_encrypted_payload_without_the_key_still_fails_the_task() -> None:
    """The worker without keys: its tasks fail and are retried until it has them (an
    EncryptionKeyError, one line naming the variables; never an ApplicationError, which
    would fail the run or the activity for good)."""
    with pytest.raises(EncryptionKeyError) as caught:
        CONVERTER.from_payloads([payload(ENCRYPTED, b"sealed")])
    assert not isinstance(caught.value, ApplicationError)
    assert "STACKFLOW_ENCRYPTION_KEY" in str(caught.value)


async def test_a_compressed_payload_that_is_not_is_left_as_it_came() -> None:
    garbage = payload(b"binary/zlib", b"\x78not zlib")
    assert await CompressionCodec().decode([garbage]) == [garbage]
    with pytest.raises(ApplicationError, match="encoding 'binary/zlib'"):
        CONVERTER.from_payloads([garbage])


async def test_json_still_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("STACKFLOW_ENCRYPTION_KEY_FILE", raising=False)
    converter = data_converter()
    request = OperationInput(project="p", spec={"resources": ["x" * 40_000]})
    encoded = await converter.encode([request])
    assert encoded[0].metadata["encoding"] == b"binary/zlib"
    assert await converter.decode(encoded, [OperationInput]) == [request]
    assert await converter.decode(encoded) == [request.model_dump(mode="json")]
