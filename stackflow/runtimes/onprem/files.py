"""One OnPrem path: its attributes, checked, and the operations on it.

A checked path (:func:`~runtimes.onprem.policy.onprem_target`) is acted on through a
descriptor of its parent directory, opened by walking down from the root without following
any symlink: a symlink planted (or swapped in) after the check is refused, never followed.
Files are opened with O_NOFOLLOW and read at most the policy's ``max_bytes``. A file is
written beside its target under a temporary name, made durable, then renamed over it
(:class:`Staged`); :mod:`~runtimes.onprem.batch` orders these steps for a batch of paths.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from stackflow.runtimes.base import Attributes, Conflict, InvalidInput, ResourceRequest, Unavailable
from stackflow.runtimes.file_roots import OnPremTarget, check_size
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy

_MODE = re.compile(r"^0?[0-7]{3,4}$")
_LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1"}


class OnPremAttributes(BaseModel):
    """The accepted attribute shape; unknown keys are refused so typos never pass silently."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["File", "Directory"]
    path: str
    content: str | None = None
    mode: str | None = None
    host: str | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not os.path.isabs(value):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return os.path.normpath(value)

    @field_validator("mode")
    @classmethod
    def _octal(cls, value: str | None) -> str | None:
        if value is not None and not _MODE.match(value):
            raise ValueError(f"must be an octal string such as '0644', got {value!r}")
        return value

    def normalised_mode(self) -> str:
        default = "0644" if self.kind == "File" else "0755"
        return f"{int(self.mode or default, 8):04o}"


def parse_attributes(resource: ResourceRequest) -> OnPremAttributes:
    try:
        attrs = OnPremAttributes.model_validate(resource.attributes)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "attributes"
        raise InvalidInput(
            f"{resource.id}: attributes.{where}: {err['msg']}", resource_id=resource.id
        ) from None
    if attrs.host not in _LOCAL_HOSTS:
        raise InvalidInput(
            f"{resource.id}: attributes.host {attrs.host!r}: only the local machine is supported "
            "(omit host or use 'localhost')",
            resource_id=resource.id,
        )
    if attrs.kind == "Directory" and attrs.content is not None:
        raise InvalidInput(
            f"{resource.id}: attributes.content: a Directory has no content",
            resource_id=resource.id,
        )
    return attrs


def desired_state(attrs: OnPremAttributes) -> Attributes:
    """The live shape a resource converges to (what read() returns after apply())."""
    state: Attributes = {"kind": attrs.kind, "path": attrs.path, "mode": attrs.normalised_mode()}
    if attrs.kind == "File":
        state["content"] = attrs.content or ""
    if attrs.host:
        state["host"] = attrs.host
    return state


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Staged:
    """A file's new content, written beside it under a temporary name derived from its own
    (a write cut short by a killed worker leaves nothing behind once the retried write of the
    same file completes). Its write-back to disk has been started; :meth:`durable` waits for
    it, :meth:`commit` renames it over the target."""

    dir_fd: int
    tmp: str
    name: str
    fd: int | None

    def durable(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def commit(self) -> None:
        self.durable()
        os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.tmp, dir_fd=self.dir_fd)


class Confined:
    """One checked path, acted on through a descriptor of its real parent directory."""

    def __init__(self, resource_id: str, target: OnPremTarget, policy: WorkerPolicy) -> None:
        self.resource_id = resource_id
        self.target = target
        self.policy = policy

    def _refuse(self, problem: str) -> PolicyViolation:
        return PolicyViolation(
            self.resource_id, "attributes.path", f"{self.target.path}: {problem}"
        )

    def open_parent(self, create: bool) -> int | None:
        """A descriptor of the real parent directory, which the caller closes (None: it does
        not exist and ``create`` is false; with ``create``, missing directories are made)."""
        target = self.target
        rel = os.path.relpath(target.parent, target.anchor)
        parts = [] if rel == "." else rel.split(os.sep)
        fd = os.open(target.anchor, _DIR_FLAGS)
        try:
            for depth, part in enumerate(parts):
                try:
                    child = self._open_dir(part, fd)
                except FileNotFoundError:
                    if not create:
                        child = None
                    else:
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(part, 0o777, dir_fd=fd)
                        child = self._open_dir(part, fd)
                except NotADirectoryError:
                    if create:
                        raise
                    child = None  # a parent is a file: this path cannot exist
                except PolicyViolation:
                    where = os.path.join(target.anchor, *parts[: depth + 1])
                    raise self._refuse(f"{where} is a symlink (planted after the check)") from None
                os.close(fd)
                fd = -1
                if child is None:
                    return None
                fd = child
            self._verify(fd, target.parent)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        return fd

    def _open_dir(self, name: str, dir_fd: int) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP or self._is_link(name, dir_fd):
                raise self._refuse(f"{name} became a symlink; refused") from None
            raise

    @staticmethod
    def _is_link(name: str, dir_fd: int) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def _verify(self, fd: int, expected: str) -> None:
        """Where the descriptor really is (Linux): still the checked directory."""
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if where != expected:
            raise self._refuse(f"its directory moved to {where} after it was checked; refused")

    def read_in(self, dir_fd: int, *, content: bool = True) -> Attributes | None:
        """The object there (``content=False``: its kind and mode only, nothing read)."""
        path, name = self.target.path, self.target.name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        if stat.S_ISDIR(st.st_mode):
            return {"kind": "Directory", "path": path, "mode": mode}
        if not stat.S_ISREG(st.st_mode):
            return {"kind": "Other", "path": path, "mode": mode}
        if not content:
            return {"kind": "File", "path": path, "mode": mode}
        limit = int(self.policy.onprem.max_bytes)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return {"kind": "Other", "path": path, "mode": mode}
            raise
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                return {"kind": "Other", "path": path, "mode": mode}
            check_size(
                self.policy, self.resource_id, "attributes.path", st.st_size, f"the file at {path}"
            )
            data = handle.read(limit + 1)
        check_size(
            self.policy, self.resource_id, "attributes.path", len(data), f"the file at {path}"
        )
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        text = data.decode("utf-8", errors="replace")
        return {"kind": "File", "path": path, "mode": mode, "content": text}

    def stage(self, dir_fd: int, content: str, mode: int) -> Staged:
        """The new content under the temporary name, its write-back to disk started."""
        name = self.target.name
        tmp = f".stackflow-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:  # left by a write that was killed mid-way
            os.unlink(tmp, dir_fd=dir_fd)
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        staged = Staged(dir_fd=dir_fd, tmp=tmp, name=name, fd=fd)
        try:
            data = content.encode("utf-8")
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fchmod(fd, mode)
            # start the write-back now: the batch's fsyncs then find most of it done
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            staged.discard()
            raise
        return staged

    def chmod(self, dir_fd: int, mode: int, *, directory: bool) -> None:
        name = self.target.name
        fd = (
            self._open_dir(name, dir_fd) if directory else os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        )
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


_PERMANENT_ERRNOS = {
    errno.ENOTDIR,
    errno.EEXIST,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ELOOP,
}


@contextlib.contextmanager
def os_errors(resource_id: str, action: str) -> Iterator[None]:
    """Filesystem errors retrying cannot fix (a parent that is a file, no permission) are a
    Conflict; anything else (disk full, I/O error) stays retryable as Unavailable."""
    try:
        yield
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        message = f"{resource_id}: cannot {action}{where}: {exc.strerror or exc}"
        if exc.errno in _PERMANENT_ERRNOS:
            raise Conflict(message, resource_id=resource_id) from None
        raise Unavailable(message, resource_id=resource_id) from None
