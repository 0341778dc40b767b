"""OnPrem runtime, local transport: files and directories on this machine.

Resources of type ``OnPrem`` carry ``attributes.kind`` ``File`` (``path``, ``content``,
``mode``) or ``Directory`` (``path``, ``mode``). ``host`` is reserved for the SSH transport
that comes later; only the local machine (no host, ``localhost``) is served today.
Writes are atomic (temp file, fsync, rename) and skipped when nothing would change.

Every path is confined by the worker policy (:mod:`stackflow.policy`): inside
``STACKFLOW_ONPREM_ROOTS`` once symlinks are resolved, never stackflow's own files, content
and files read at most ``STACKFLOW_ONPREM_MAX_BYTES``. Files are then reached through a
descriptor of their directory, opened from the root without following symlinks, so a
symlink planted after the check is refused rather than followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from stackflow.policy import PolicyViolation, WorkerPolicy, worker_policy
from stackflow.runtimes.base import (
    Attributes,
    Conflict,
    InvalidInput,
    PreviewResult,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.onprem.policy import OnPremTarget, check_content, check_size, onprem_target
from stackflow.runtimes.onprem.rules import TYPE_NAME

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


class _Confined:
    """One checked path (:func:`~runtimes.onprem.policy.onprem_target`), acted on through a
    descriptor of its parent directory, opened by walking down from the root without following any
    symlink: a symlink planted (or swapped in) after the check is refused, never followed.
    Files are opened with O_NOFOLLOW and read at most ``max_bytes``."""

    def __init__(self, resource_id: str, target: OnPremTarget, policy: WorkerPolicy) -> None:
        self.resource_id = resource_id
        self.target = target
        self.policy = policy

    def _refuse(self, problem: str) -> PolicyViolation:
        return PolicyViolation(
            self.resource_id, "attributes.path", f"{self.target.path}: {problem}"
        )

    @contextlib.contextmanager
    def parent(self, *, create: bool) -> Iterator[int | None]:
        """A descriptor of the real parent directory (None: it does not exist and ``create``
        is false; with ``create``, missing directories are made)."""
        fd = self._walk(create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _walk(self, create: bool) -> int | None:
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

    def read(self) -> Attributes | None:
        with self.parent(create=False) as fd:
            return None if fd is None else self.read_in(fd)

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

    def write_file(self, dir_fd: int, content: str, mode: int) -> None:
        """Atomically: a temporary file beside it, fsync, rename, fsync the directory.

        The temporary name is derived from the target's, so a write cut short by a killed
        worker leaves nothing behind once the retried write of the same file completes."""
        tmp = f".stackflow-{hashlib.sha256(self.target.name.encode()).hexdigest()[:16]}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)  # left by a write that was killed mid-way
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content.encode("utf-8"))
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, self.target.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)

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


def read_sync(resource_id: str, place: _Confined) -> Attributes | None:
    with _os_errors(resource_id, "read"):
        return place.read()


def apply_sync(resource_id: str, attrs: OnPremAttributes, place: _Confined) -> Attributes:
    with _os_errors(resource_id, "apply"):
        return _apply_sync(resource_id, attrs, place)


def _apply_sync(resource_id: str, attrs: OnPremAttributes, place: _Confined) -> Attributes:
    want = desired_state(attrs)
    mode = int(want["mode"], 8)
    with place.parent(create=True) as fd:
        assert fd is not None
        live = place.read_in(fd)
        if live is not None and live["kind"] != attrs.kind:
            raise Conflict(
                f"{resource_id}: {attrs.path} exists as a {live['kind']}, not a {attrs.kind}; "
                "remove it or change the path",
                resource_id=resource_id,
            )
        if attrs.kind == "File":
            if live is None or live.get("content") != want["content"]:
                place.write_file(fd, want["content"], mode)
            elif live["mode"] != want["mode"]:
                place.chmod(fd, mode, directory=False)
        else:
            if live is None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(place.target.name, 0o777, dir_fd=fd)
                os.fsync(fd)
            place.chmod(fd, mode, directory=True)
        state = place.read_in(fd)
    assert state is not None
    return state


def delete_sync(resource_id: str, attrs: OnPremAttributes, place: _Confined) -> None:
    with _os_errors(resource_id, "delete"):
        _delete_sync(resource_id, attrs, place)


def _delete_sync(resource_id: str, attrs: OnPremAttributes, place: _Confined) -> None:
    with place.parent(create=False) as fd:
        if fd is None:
            return
        live = place.read_in(fd, content=False)
        if live is None:
            return
        if live["kind"] != attrs.kind:
            raise Conflict(
                f"{resource_id}: {attrs.path} is a {live['kind']}, not the {attrs.kind} "
                "stackflow made; left in place",
                resource_id=resource_id,
            )
        if attrs.kind == "File":
            os.unlink(place.target.name, dir_fd=fd)
        else:
            try:
                os.rmdir(place.target.name, dir_fd=fd)
            except OSError as exc:
                raise Conflict(
                    f"{resource_id}: directory {attrs.path} is not empty (it holds files no "
                    f"resource of this stack deletes first): {exc.strerror}",
                    resource_id=resource_id,
                ) from None
        os.fsync(fd)


class OnPremRuntime(Runtime):
    """Files and directories on the local machine, inside the worker policy's roots."""

    type_name = TYPE_NAME
    checks_every_call = True  # every call starts with _place: the policy on that very path

    def __init__(self, policy: WorkerPolicy | None = None) -> None:
        self._policy = policy

    @property
    def policy(self) -> WorkerPolicy:
        return self._policy if self._policy is not None else worker_policy()

    def _place(
        self, resource: ResourceRequest, *, reading: bool = True, content: bool = True
    ) -> tuple[OnPremAttributes, _Confined]:
        """The attributes, checked against the policy (path, content size, size of the file
        there), and where the path really lives."""
        attrs = parse_attributes(resource)
        policy = self.policy
        target = onprem_target(
            policy, resource.id, attrs.path, directory=attrs.kind == "Directory", reading=reading
        )
        if content:
            check_content(policy, resource.id, attrs.content)
        return attrs, _Confined(resource.id, target, policy)

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self._place(resource)

    def _look(self, resource: ResourceRequest) -> tuple[OnPremAttributes, Attributes | None]:
        """The attributes (policy checked) and the file as it is (None: absent)."""
        attrs, place = self._place(resource)
        live = read_sync(resource.id, place)
        if live is not None and attrs.host:
            live["host"] = attrs.host
        return attrs, live

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        _, live = await asyncio.to_thread(self._look, resource)
        return live

    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        attrs, _ = await asyncio.to_thread(self._place, resource)
        return PreviewResult(would_be=desired_state(attrs))

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """The file as it is and what it would become, from one policy check and one look."""

        attrs, live = await asyncio.to_thread(self._look, resource)
        return live, (PreviewResult(would_be=desired_state(attrs)) if with_preview else None)

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        def apply() -> Attributes:
            attrs, place = self._place(resource)
            live = apply_sync(resource.id, attrs, place)
            if attrs.host:
                live["host"] = attrs.host
            return live

        return await asyncio.to_thread(apply)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        def delete() -> None:
            # what is recorded is deleted whatever its size; the path is checked
            attrs, place = self._place(resource, reading=False, content=False)
            delete_sync(resource.id, attrs, place)

        await asyncio.to_thread(delete)
