"""Crash-safe file writes: temp file, fsync, rename, fsync of the directory."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_line(path: Path, line: bytes) -> None:
    """Durably append one line; heals a torn last line (no trailing newline) first."""
    created = not path.exists()
    if created:
        path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        prefix = b""
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                prefix = b"\n"
        fh.write(prefix + line.rstrip(b"\n") + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    if created:
        fsync_dir(path.parent)
