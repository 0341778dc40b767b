"""The data converter every stackflow client and worker uses: pydantic JSON payloads,
compressed (so multi-MB specs fit Temporal's 2 MB payload limit), then, when keys are
configured (``STACKFLOW_ENCRYPTION_KEY`` / ``_FILE``, see :mod:`stackflow.core.crypto`), encrypted
with AES-256-GCM, the key id in the payload's metadata. Decoding takes payloads as they come:
plain JSON from ``temporal workflow start`` is read as well, unless a worker requires
encrypted input (``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS=1``, :class:`RequireEncrypted`): then
a run or an Update whose input was not encrypted with the keys fails at once, with one line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.exceptions import ApplicationError, FailureError

from stackflow.core.crypto import EncryptionKeyError, KeyRing
from stackflow.core.errors import StackflowError

log = logging.getLogger(__name__)

ENCODING = b"binary/zlib"
MIN_SIZE = 16 * 1024
"""Smaller payloads (most inputs, results and activity calls) stay plain JSON, readable as
they are in the Temporal UI and `temporal workflow show/result`; big specs are compressed."""
PAYLOAD_LIMIT = 2 * 1024 * 1024
"""Temporal's default limit for one payload (blob size limit)."""
INFLATE_LIMIT = 128 * 1024 * 1024
"""Most bytes the compressed payloads of one decode call inflate to, together. What this
codec writes fits Temporal's payload limit compressed (a spec over the budget goes to the
state backend instead), so real payloads stay far below it; a zlib bomb (a few hundred KB
that inflate to gigabytes) stops here, never held in memory."""


class PayloadTooLarge(StackflowError):
    """A compressed payload inflates past :data:`INFLATE_LIMIT`."""

    exit_code = 2


INFLATE_CHUNK = 1024 * 1024


def inflate(data: bytes, limit: int) -> bytes:
    """``data`` decompressed (zlib) when it inflates to at most ``limit`` bytes; else
    PayloadTooLarge, found by inflating a chunk at a time and counting, so a bomb costs a
    chunk of memory, never its size. zlib.error when it is not zlib."""
    inflater = zlib.decompressobj()
    size, pending = 0, data
    while pending:
        size += len(inflater.decompress(pending, INFLATE_CHUNK))
        pending = inflater.unconsumed_tail
        if size > limit:
            raise PayloadTooLarge(f"a compressed payload inflates to over {limit // 2**20} MiB")
    if size + len(inflater.flush()) > limit:  # what zlib held back once the input ran out
        raise PayloadTooLarge(f"a compressed payload inflates to over {limit // 2**20} MiB")
    return zlib.decompress(data)


class CompressionCodec(PayloadCodec):
    """zlib over payloads of :data:`MIN_SIZE` and more. Decoding inflates at most
    ``limit`` bytes per call: past it a payload is left as it came (a worker's converter
    then refuses it, see :class:`PayloadConverter`), or, ``strict`` (the codec server),
    PayloadTooLarge is raised. ``warn_no_key``: an encrypted payload in a process without
    keys is logged once (a worker's, the API's); a command reports it as its error line."""

    def __init__(
        self, limit: int = INFLATE_LIMIT, strict: bool = False, warn_no_key: bool = True
    ) -> None:
        self.limit, self.strict, self.warn_no_key = limit, strict, warn_no_key

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            raw = payload.SerializeToString()
            if len(raw) < MIN_SIZE:
                out.append(payload)
                continue
            packed = zlib.compress(raw, 6)
            if len(packed) > 0.9 * len(raw):
                out.append(payload)
                continue
            out.append(Payload(metadata={"encoding": ENCODING}, data=packed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        budget = self.limit
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCRYPTED and self.warn_no_key:
                # Only reached without keys (with keys, decryption ran before this codec).
                _warn_no_key(payload)
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)
                continue
            try:
                raw = inflate(payload.data, budget)
                budget -= len(raw)
                inner = Payload()
                inner.ParseFromString(raw)
            except PayloadTooLarge as err:
                if self.strict:
                    raise PayloadTooLarge(
                        f"payload {len(out) + 1}: {err} (the payloads of one request "
                        f"inflate to at most {self.limit // 2**20} MiB together)"
                    ) from None
                log.warning("a compressed payload was not inflated: %s", err)
                out.append(payload)
                continue
            except Exception:
                # not what this codec wrote: left as it came, the payload converter refuses
                # it (a workflow's input: the run fails, see PayloadConverter)
                out.append(payload)
                continue
            out.append(inner)
        return out


ENCRYPTED = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_warned_no_key = False


def no_key(payload: Payload) -> EncryptionKeyError:
    """What reading ``payload``, encrypted under a key this process does not have, is."""
    kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")[:64]
    return EncryptionKeyError(
        f"a Temporal payload is encrypted with key {kid!r} and this process has no encryption "
        "key: set STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE to the keys the "
        "workers use (or go through the API: STACKFLOW_API_URL)"
    )


def _warn_no_key(payload: Payload) -> None:
    """One log line per process when encrypted payloads arrive and no key is configured: a
    worker in that state fails every task of an encrypted run, and Temporal retries them."""
    global _warned_no_key
    if _warned_no_key:
        return
    _warned_no_key = True
    kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")[:64]
    log.error(
        "received a Temporal payload encrypted with key %r, but this process has no "
        "encryption key: it cannot read it, and tasks that need it fail and are retried "
        "until STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE gives it the keys "
        "the clients use",
        kid,
    )


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over the whole payload (metadata and data), key id in the metadata."""

    def __init__(self, keys: KeyRing) -> None:
        self.keys = keys

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            kid, blob = self.keys.encrypt(payload.SerializeToString(), ENCRYPTED)
            out.append(Payload(metadata={"encoding": ENCRYPTED, KEY_ID: kid.encode()}, data=blob))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCRYPTED:
                out.append(payload)
                continue
            kid = payload.metadata.get(KEY_ID, b"").decode()
            plain = self.keys.decrypt(kid, payload.data, ENCRYPTED, what="a Temporal payload")
            inner = Payload()
            inner.ParseFromString(plain)
            out.append(inner)
        return out


class ChainCodec(PayloadCodec):
    """Codecs applied in order on encode and in reverse on decode."""

    def __init__(self, *codecs: PayloadCodec) -> None:
        self.codecs = codecs

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        current = list(payloads)
        for codec in self.codecs:
            current = list(await codec.encode(current))
        return current

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        current = list(payloads)
        for codec in reversed(self.codecs):
            current = list(await codec.decode(current))
        return current


REQUIRE_ENCRYPTED_ENV = "STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS"
UNENCRYPTED = "stackflow-unencrypted"
"""Metadata key a worker that requires encrypted input puts, in memory only, on each payload
it was given unencrypted (its decoded form is never stored or sent again)."""


def require_encrypted_from_env() -> bool:
    """``STACKFLOW_REQUIRE_ENCRYPTED_PAYLOADS``: ``1``/``true`` on, unset/``0``/``false`` off."""
    value = os.environ.get(REQUIRE_ENCRYPTED_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise EncryptionKeyError(f"{REQUIRE_ENCRYPTED_ENV}={value[:20]!r}: use 1 or 0")


class RequireEncrypted(PayloadCodec):
    """A worker's codec that marks what arrived unencrypted (``UNENCRYPTED``); the payload
    converter then refuses such a payload as a run's or an Update's input: the run fails at
    once (non-retryable ``InvalidInput``), the Update is rejected, never a workflow task
    retried forever. Everything else (activity results, queries) is this worker's own and
    encrypted, and is decoded as before. Whoever holds no key cannot make a marked payload
    look unmarked: the mark is set here, after decoding, on whatever was not encrypted."""

    def __init__(self, inner: PayloadCodec) -> None:
        self.inner = inner

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(await self.inner.encode([_unmarked(p) for p in payloads]))

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        plain = [p.metadata.get("encoding") != ENCRYPTED for p in payloads]
        decoded = list(await self.inner.decode(payloads))
        out = []
        for payload, unencrypted in zip(decoded, plain, strict=True):
            if unencrypted:
                marked = Payload()
                marked.CopyFrom(payload)
                marked.metadata[UNENCRYPTED] = b"1"
                payload = marked
            out.append(payload)
        return out


def _unmarked(payload: Payload) -> Payload:
    if UNENCRYPTED not in payload.metadata:
        return payload
    copy = Payload()
    copy.CopyFrom(payload)
    del copy.metadata[UNENCRYPTED]
    return copy


def payload_codec(
    keys: KeyRing | None = None,
    require_encrypted: bool = False,
    *,
    strict: bool = False,
    warn_no_key: bool = True,
) -> PayloadCodec:
    """Compression, then encryption when keys are configured (``keys`` or the environment);
    ``require_encrypted`` (a worker's setting, needs keys): unencrypted input is marked, and
    refused as a run's or an Update's input (:class:`RequireEncrypted`); ``strict``: a payload
    that inflates past :data:`INFLATE_LIMIT` raises PayloadTooLarge (the codec server's 413)
    instead of being left as it came."""
    keys = keys if keys is not None else KeyRing.from_env()
    compression = CompressionCodec(strict=strict, warn_no_key=warn_no_key)
    if keys is None:
        return compression
    codec = ChainCodec(compression, EncryptionCodec(keys))
    return RequireEncrypted(codec) if require_encrypted else codec


class PayloadConverter(PydanticPayloadConverter):
    """Pydantic JSON; and a payload decoded without a type (a workflow's or an Update's
    arguments: workflow code checks them itself, see ``workflows.common.checked_input``)
    that cannot be decoded at all raises a non-retryable ``InvalidInput`` ApplicationError,
    so the run (or the Update) fails at once, where the SDK's own error would fail the
    workflow task, retried forever. Such payloads come from clients that set an encoding of
    their own (``temporal workflow start --input-meta encoding=…``, a protobuf message).
    An encrypted payload a process without the key cannot read is one ``EncryptionKeyError``
    line (a CLI's exit 2): in a worker that task fails and is retried until it has the keys.

    The SDK makes a payload converter for each workflow activation and activity task (it
    copies the data converter with a serialization context); they all share the parts of
    the process's first one, the pydantic type adapters it has built among them, instead of
    building their own for every type they decode."""

    _shared: ClassVar[dict[str, Any] | None] = None

    def __init__(self) -> None:
        shared = PayloadConverter._shared
        if shared is None:
            super().__init__()
            PayloadConverter._shared = dict(vars(self))
        else:
            vars(self).update(shared)

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        if not type_hints:
            for index, payload in enumerate(payloads):
                if UNENCRYPTED in payload.metadata:
                    raise ApplicationError(
                        f"invalid input: argument {index + 1} is not encrypted, and this worker "
                        f"refuses unencrypted input ({REQUIRE_ENCRYPTED_ENV}=1); start runs "
                        "with stackflow, or encode through the codec server "
                        "(`temporal workflow start --codec-endpoint …`)",
                        type="InvalidInput",
                        non_retryable=True,
                    )
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCRYPTED:  # still sealed: no key here
                raise no_key(payload)
        try:
            return super().from_payloads(payloads, type_hints)
        except FailureError:
            raise
        except Exception as err:
            if type_hints:
                raise
            index, reason = self._first_failure(payloads, err)
            encoding = payloads[index].metadata.get("encoding", b"").decode(errors="replace")
            raise ApplicationError(
                f"invalid input: argument {index + 1} cannot be decoded (encoding "
                f"{encoding[:40]!r}): {reason}; send JSON (json/plain)",
                type="InvalidInput",
                non_retryable=True,
            ) from None

    def _first_failure(self, payloads: Sequence[Payload], err: Exception) -> tuple[int, str]:
        """Which payload cannot be decoded, and why (one short line)."""
        for index, payload in enumerate(payloads):
            try:
                super().from_payloads([payload])
            except Exception as one:
                return index, _reason(one)
        return 0, _reason(err)


def _reason(err: Exception) -> str:
    if isinstance(err, KeyError):
        return "not an encoding stackflow reads"
    if isinstance(err, ValidationError):
        return str(err.errors(include_url=False)[0].get("msg", "invalid JSON"))[:200]
    cause = err.__cause__
    text = str(cause if isinstance(cause, Exception) else err) or type(err).__name__
    return text.splitlines()[0][:200]


def data_converter(
    keys: KeyRing | None = None, require_encrypted: bool = False, *, command: bool = False
) -> DataConverter:
    """``command``: a CLI's, where a payload it cannot read is its error line
    (:func:`no_key`), never also a log line."""
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=PayloadConverter,
        payload_codec=payload_codec(keys, require_encrypted, warn_no_key=not command),
    )
