"""The data converter every stackflow client and worker uses: pydantic JSON payloads,
compressed by a payload codec so multi-MB specs (CRD bundles) fit Temporal's 2 MB payload
limit. Payloads that compression does not shrink enough travel as they are, so plain JSON
from ``temporal workflow start`` is read as well.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

ENCODING = b"binary/zlib"
MIN_SIZE = 16 * 1024
"""Smaller payloads (most inputs, results and activity calls) stay plain JSON, readable as
they are in the Temporal UI and `temporal workflow show/result`; big specs are compressed."""
PAYLOAD_LIMIT = 2 * 1024 * 1024
"""Temporal's default limit for one payload (blob size limit)."""


class CompressionCodec(PayloadCodec):
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
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)
                continue
            inner = Payload()
            inner.ParseFromString(zlib.decompress(payload.data))
            out.append(inner)
        return out


def data_converter() -> DataConverter:
    return dataclasses.replace(pydantic_data_converter, payload_codec=CompressionCodec())


async def encoded_size(value: object) -> int:
    """Bytes ``value`` takes as a payload once encoded and compressed."""
    converter = data_converter()
    payloads = await converter.encode([value])
    return sum(p.ByteSize() for p in payloads)
