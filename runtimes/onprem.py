"""OnPrem runtime, local transport: files and directories on this machine.

Resources of type ``OnPrem`` carry ``attributes.kind`` ``File`` (``path``, ``content``,
``mode``) or ``Directory`` (``path``, ``mode``). ``host`` is reserved for the SSH transport
that comes later; only the local machine (no host, ``localhost``) is served today.
Writes are atomic (temp file, fsync, rename) and skipped when nothing would change.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from runtimes.base import (
    Attributes,
    Conflict,
    InvalidInput,
    PreviewResult,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
    Unavailable,
)

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


def read_path(path: str) -> Attributes | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        # NotADirectoryError: a parent is a regular file, so this path cannot exist.
        return None
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if stat.S_ISDIR(st.st_mode):
        return {"kind": "Directory", "path": path, "mode": mode}
    if stat.S_ISREG(st.st_mode):
        content = Path(path).read_bytes().decode("utf-8", errors="replace")
        return {"kind": "File", "path": path, "mode": mode, "content": content}
    return {"kind": "Other", "path": path, "mode": mode}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: str, content: str, mode: int) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".stackflow-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8"))
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


_PERMANENT_ERRNOS = {
    errno.ENOTDIR,
    errno.EEXIST,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
}


@contextlib.contextmanager
def _os_errors(resource_id: str, action: str) -> Iterator[None]:
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


def apply_sync(resource_id: str, attrs: OnPremAttributes) -> Attributes:
    with _os_errors(resource_id, "apply"):
        return _apply_sync(resource_id, attrs)


def _apply_sync(resource_id: str, attrs: OnPremAttributes) -> Attributes:
    want = desired_state(attrs)
    live = read_path(attrs.path)
    mode = int(want["mode"], 8)
    if live is not None and live["kind"] != attrs.kind:
        raise Conflict(
            f"{resource_id}: {attrs.path} exists as a {live['kind']}, not a {attrs.kind}; "
            "remove it or change the path",
            resource_id=resource_id,
        )
    if attrs.kind == "File":
        if live is None or live.get("content") != want["content"]:
            write_file_atomically(attrs.path, want["content"], mode)
        elif live["mode"] != want["mode"]:
            os.chmod(attrs.path, mode)
    else:
        if live is None:
            os.makedirs(attrs.path, exist_ok=True)
            _fsync_dir(os.path.dirname(attrs.path) or "/")
        os.chmod(attrs.path, mode)
    state = read_path(attrs.path)
    assert state is not None
    return state


def delete_sync(resource_id: str, attrs: OnPremAttributes) -> None:
    with _os_errors(resource_id, "delete"):
        _delete_sync(resource_id, attrs)


def _delete_sync(resource_id: str, attrs: OnPremAttributes) -> None:
    live = read_path(attrs.path)
    if live is None:
        return
    if live["kind"] != attrs.kind:
        raise Conflict(
            f"{resource_id}: {attrs.path} is a {live['kind']}, not the {attrs.kind} "
            "stackflow made; left in place",
            resource_id=resource_id,
        )
    if attrs.kind == "File":
        os.unlink(attrs.path)
    else:
        try:
            os.rmdir(attrs.path)
        except OSError as exc:
            raise Conflict(
                f"{resource_id}: directory {attrs.path} is not empty (it holds files no resource "
                f"of this stack deletes first): {exc.strerror}",
                resource_id=resource_id,
            ) from None
    _fsync_dir(os.path.dirname(attrs.path) or "/")


class OnPremRuntime(Runtime):
    """Files and directories on the local machine."""

    type_name = "OnPrem"

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        attrs = parse_attributes(resource)
        live = await asyncio.to_thread(read_path, attrs.path)
        if live is not None and attrs.host:
            live["host"] = attrs.host
        return live

    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        return PreviewResult(would_be=desired_state(parse_attributes(resource)))

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        attrs = parse_attributes(resource)
        live = await asyncio.to_thread(apply_sync, resource.id, attrs)
        if attrs.host:
            live["host"] = attrs.host
        return live

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        attrs = parse_attributes(resource)
        await asyncio.to_thread(delete_sync, resource.id, attrs)
