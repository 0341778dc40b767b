"""Bounds on what a git fetch takes in (:mod:`stackflow.model.source`): the bytes of the pack a
remote sends, the time the fetch takes, and the size any object of it inflates to.

A fetch writes the pack it receives to a file through :class:`PackSink` (over
``STACKFLOW_GIT_MAX_PACK_BYTES`` or past ``STACKFLOW_GIT_FETCH_TIMEOUT`` it stops), then
:func:`check_pack` reads every entry's header and inflates its data a chunk at a time,
keeping nothing, before dulwich indexes it (which inflates each object whole): an object, or
the object a delta makes, over :data:`OBJECT_LIMIT` refuses the pack, so a zlib or delta bomb
never reaches memory. :func:`stored_size` gives an object's size from its pack entry's header
without inflating it, so a spec file over its limit is refused before it is read.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from stackflow.core.errors import SpecError

MAX_PACK_ENV = "STACKFLOW_GIT_MAX_PACK_BYTES"
FETCH_TIMEOUT_ENV = "STACKFLOW_GIT_FETCH_TIMEOUT"
MAX_PACK_BYTES = 256 * 1024 * 1024
"""Bytes of pack one fetch may receive by default."""
FETCH_SECONDS = 120.0
"""Seconds one fetch may take by default (the ref advertisement, the pack, its checks)."""
OBJECT_LIMIT = 100 * 1024 * 1024
"""Largest object (file, tree, commit) a fetched pack may hold once inflated, as GitHub
refuses files over 100 MiB."""
INFLATE_STEP = 4096
"""Compressed bytes of an entry inflated at once (its output at most about 4 MiB)."""

OFS_DELTA, REF_DELTA = 6, 7
BASE_TYPES = frozenset({1, 2, 3, 4})  # commit, tree, blob, tag


class FetchRefused(SpecError):
    """A fetch went past one of its bounds (exit 2, never retried)."""


@dataclass(frozen=True)
class FetchLimits:
    pack_bytes: int = MAX_PACK_BYTES
    seconds: float = FETCH_SECONDS
    object_bytes: int = OBJECT_LIMIT

    @classmethod
    def from_env(cls) -> FetchLimits:
        return cls(
            pack_bytes=int(_number(MAX_PACK_ENV, MAX_PACK_BYTES)),
            seconds=_number(FETCH_TIMEOUT_ENV, FETCH_SECONDS),
            object_bytes=OBJECT_LIMIT,
        )


def _number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise SpecError(f"{name}={text!r}: a positive number is expected")
    return value


def mib(n: float) -> str:
    return f"{n / 2**20:g} MiB"


class PackSink:
    """Where a fetch writes the pack it receives: ``file``, at most ``limits.pack_bytes``
    and until ``deadline`` (``time.monotonic()``), else FetchRefused / ``too_slow()``."""

    def __init__(
        self, file: IO[bytes], url: str, limits: FetchLimits, too_slow: Callable[[], Exception]
    ) -> None:
        self.file, self.url, self.limits, self.too_slow = file, url, limits, too_slow
        self.deadline = time.monotonic() + limits.seconds
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limits.pack_bytes:
            raise FetchRefused(
                f"git source {self.url}: the pack is over {mib(self.limits.pack_bytes)} "
                f"({MAX_PACK_ENV}); fetch stopped"
            )
        self.check_time()
        self.file.write(data)
        return len(data)

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.too_slow()


def _varint(data: Any, pos: int) -> tuple[int, int]:
    """A size as delta headers write it (7 bits a byte, least significant first)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _entry_header(data: Any, pos: int) -> tuple[int, int, int]:
    """(type, inflated size, where its zlib data starts) of the pack entry at ``pos``."""
    byte = data[pos]
    kind, size, shift = (byte >> 4) & 7, byte & 0x0F, 4
    pos += 1
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
    if kind == OFS_DELTA:
        while data[pos] & 0x80:
            pos += 1
        pos += 1
    elif kind == REF_DELTA:
        pos += 20
    elif kind not in BASE_TYPES:
        raise ValueError(f"unknown entry type {kind}")
    return kind, size, pos


def _delta_target(head: bytes) -> int | None:
    """The size of the object a delta makes, from the delta's first bytes (None: too few)."""
    try:
        _, pos = _varint(head, 0)
        return _varint(head, pos)[0]
    except IndexError:
        return None


def check_pack(path: str, url: str, sink: PackSink) -> None:
    """Every entry of the pack file ``path``: its inflated size (an object's, or the object a
    delta makes) at most ``sink.limits.object_bytes``, its data inflated a chunk at a time and
    dropped (no more than its header says), within the sink's deadline. FetchRefused."""
    limit = sink.limits.object_bytes

    def bad(why: str) -> FetchRefused:
        return FetchRefused(f"git source {url}: the pack it sent is not valid ({why})")

    if os.path.getsize(path) < 32:
        raise bad("no pack header")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"PACK":
            raise bad("no pack header")
        count = int.from_bytes(data[8:12], "big")
        pos, end = 12, len(data) - 20
        for n in range(count):
            try:
                kind, size, pos = _entry_header(data, pos)
            except (IndexError, ValueError) as err:
                raise bad(f"entry {n + 1}: {err}") from None
            if kind in BASE_TYPES and size > limit:
                raise FetchRefused(
                    f"git source {url}: an object of {mib(size)} is over {mib(limit)}, the "
                    "largest file a fetch takes in; fetch stopped"
                )
            inflater, seen, head = zlib.decompressobj(), 0, b""
            while not inflater.eof:
                sink.check_time()
                if pos >= end:
                    raise bad(f"entry {n + 1} is cut short")
                # an unbounded inflate of a small chunk: deflate inflates at most about
                # 1,032 times what it reads, so its output stays within INFLATE_STEP * 1,032
                chunk = data[pos : min(pos + INFLATE_STEP, end)]
                try:
                    out = inflater.decompress(chunk)
                except zlib.error as err:
                    raise bad(f"entry {n + 1}: {err}") from None
                seen += len(out)
                if len(head) < 32:
                    head += out[: 32 - len(head)]
                if seen > size:
                    raise bad(f"entry {n + 1} inflates past the {size} bytes it declares")
                pos += len(chunk) - len(inflater.unused_data)
            if kind not in BASE_TYPES:
                target = _delta_target(head)
                if target is None:
                    raise bad(f"entry {n + 1}: a delta without its sizes")
                if target > limit:
                    raise FetchRefused(
                        f"git source {url}: a delta makes an object of {mib(target)}, over "
                        f"{mib(limit)}, the largest file a fetch takes in; fetch stopped"
                    )


def stored_size(repo: Any, sha: bytes) -> int | None:
    """The size object ``sha`` of ``repo`` inflates to, from its pack entry's header (a
    delta's: the object it makes), inflating no more than a delta's first bytes; None when
    it is not in a pack."""
    for pack in repo.object_store.packs:
        try:
            offset = pack.index.object_offset(sha)
        except KeyError:
            continue
        index_path = str(pack.index.path)
        with open(index_path.removesuffix(".idx") + ".pack", "rb") as f:
            f.seek(offset)
            head = f.read(64)
            kind, size, pos = _entry_header(head, 0)
            if kind in BASE_TYPES:
                return size
            f.seek(offset + pos)
            inflater, first = zlib.decompressobj(), b""
            while len(first) < 32 and not inflater.eof:
                chunk = inflater.unconsumed_tail or f.read(256)
                if not chunk:
                    break
                first += inflater.decompress(chunk, 32 - len(first))
        return _delta_target(first)
    return None
