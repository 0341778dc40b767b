"""The worker's own filesystem, one of the two :class:`~.files.Filesystem` s (the other is
:mod:`.sftp`).

A checked path is acted on through a descriptor of its parent directory, opened by walking
down from the root without following any symlink: a symlink planted (or swapped in) after the
check is refused, never followed. Files are opened with O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stackflow.runtimes.onprem.files import Call, Stat
from stackflow.runtimes.policy import PolicyViolation

if TYPE_CHECKING:
    from stackflow.runtimes.onprem.files import Confined

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class LocalStaged:
    """A file's new content under its temporary name, its write-back to disk started."""

    dir_fd: int
    tmp: str
    name: str
    fd: int | None

    async def durable(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    async def commit(self) -> None:
        await self.durable()
        os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    async def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.tmp, dir_fd=self.dir_fd)


class LocalDir:
    """A directory of this machine, by descriptor."""

    def __init__(self, fd: int, where: Confined) -> None:
        self.fd = fd
        self.where = where

    async def stat(self, name: str) -> Stat | None:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Stat(st.st_mode, st.st_size)

    async def read(self, name: str, limit: int) -> tuple[Stat, bytes] | None:
        there = await self.stat(name)
        if there is None or not stat.S_ISREG(there.mode):
            return None if there is None else (there, b"")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink swapped in since the stat
                return Stat(stat.S_IFLNK | stat.S_IMODE(there.mode), 0), b""
            raise
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            found = Stat(st.st_mode, st.st_size)
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                return found, b""
            return found, handle.read(limit + 1)

    async def stage(self, name: str, tmp: str, data: bytes, mode: int) -> LocalStaged:
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=self.fd)
        except FileExistsError:  # left by a write that was killed mid-way
            os.unlink(tmp, dir_fd=self.fd)
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=self.fd)
        staged = LocalStaged(dir_fd=self.fd, tmp=tmp, name=name, fd=fd)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fchmod(fd, mode)
            # start the write-back now: the batch's fsyncs then find most of it done
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            await staged.discard()
            raise
        return staged

    async def chmod(self, name: str, mode: int, *, directory: bool) -> None:
        fd = (
            _open_dir(self.where, name, self.fd)
            if directory
            else os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        )
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    async def mkdir(self, name: str) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=self.fd)

    async def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    async def rmdir(self, name: str) -> None:
        os.rmdir(name, dir_fd=self.fd)

    async def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class LocalFilesystem:
    """This machine's files: each parent directory opened from its root, no symlink followed."""

    key = ""
    concurrency = 1

    def each(self, calls: Sequence[Call]) -> None:
        """Each call run to its end in this thread (plain system calls: none waits on a loop)."""
        for call in calls:
            step = call()
            try:
                step.send(None)
            except StopIteration:
                continue
            step.close()
            raise RuntimeError("a step on this machine's files waited on an event loop")

    async def systemctl(self, *args: str) -> tuple[int, str]:
        if shutil.which("systemctl") is None:
            raise OSError(errno.ENOENT, "no systemctl on this machine", "systemctl")
        done = subprocess.run(
            ["systemctl", *args], capture_output=True, text=True, timeout=60, check=False
        )
        return done.returncode, (done.stdout + done.stderr).strip()

    async def open_parent(self, where: Confined, create: bool) -> LocalDir | None:
        target = where.target
        rel = os.path.relpath(target.parent, target.anchor)
        parts = [] if rel == "." else rel.split(os.sep)
        fd = os.open(target.anchor, _DIR_FLAGS)
        try:
            for depth, part in enumerate(parts):
                try:
                    child = _open_dir(where, part, fd)
                except FileNotFoundError:
                    if not create:
                        child = None
                    else:
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(part, 0o777, dir_fd=fd)
                        child = _open_dir(where, part, fd)
                except NotADirectoryError:
                    if create:
                        raise
                    child = None  # a parent is a file: this path cannot exist
                except PolicyViolation:
                    at = os.path.join(target.anchor, *parts[: depth + 1])
                    raise where.refuse(f"{at} is a symlink (planted after the check)") from None
                os.close(fd)
                fd = -1
                if child is None:
                    return None
                fd = child
            _verify(where, fd, target.parent)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        return LocalDir(fd, where)


LOCAL = LocalFilesystem()


def _open_dir(where: Confined, name: str, dir_fd: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or _is_link(name, dir_fd):
            raise where.refuse(f"{name} became a symlink; refused") from None
        raise


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _verify(where: Confined, fd: int, expected: str) -> None:
    """Where the descriptor really is (Linux): still the checked directory."""
    try:
        at = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return
    if at != expected:
        raise where.refuse(f"its directory moved to {at} after it was checked; refused")
