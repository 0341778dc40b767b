"""One OnPrem path: its attributes, checked, and the operations on it.

A checked path (:func:`~runtimes.file_roots.onprem_target` on this machine,
:func:`~runtimes.onprem.sftp.host_target` on a host) is acted on through its parent
directory (:class:`Dir`) on its :class:`Filesystem`: this machine's (:mod:`.local`, by
descriptor, no symlink followed) or a host's over SFTP (:mod:`.sftp`). The file logic here
and in :mod:`.batch` is written once for both. Files are read at most the policy's
``max_bytes``; a file is written beside its target under a temporary name, made durable,
then renamed over it (:class:`Staged`); :mod:`~runtimes.onprem.batch` orders these steps.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stackflow.runtimes.base import Attributes, Conflict, InvalidInput, ResourceRequest, Unavailable
from stackflow.runtimes.file_roots import OnPremTarget, check_size
from stackflow.runtimes.onprem.hosts import parse_host
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy

_MODE = re.compile(r"^0?[0-7]{3,4}$")
LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1"}
"""``host`` values that mean this machine (``ssh://`` reaches any host, loopback too)."""


class OnPremAttributes(BaseModel):
    """The accepted attribute shape; unknown keys are refused so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: Literal["File", "Directory", "Service"]
    path: str
    content: str | None = None
    mode: str | None = None
    host: str | None = None
    enabled: bool | None = None
    """A Service's unit enabled (default) or not."""
    active: bool | None = None
    """A Service's unit started (true) or stopped (false) by the host's running systemd;
    None: left as it is (no running systemd needed)."""
    restart_on: list[Any] | str | None = Field(default=None, alias="restartOn", max_length=64)
    """The id (or ``$kusion_path.<id>``) of each resource whose change restarts the unit
    (resolved by the engine to its live state: a dependency, written first); recorded as
    its digest."""

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
        default = "0755" if self.kind == "Directory" else "0644"
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
    if attrs.host not in LOCAL_HOSTS:
        try:
            parse_host(attrs.host or "")
        except ValueError as exc:
            raise InvalidInput(
                f"{resource.id}: attributes.host: {exc}", resource_id=resource.id
            ) from None
    problem = None
    if attrs.kind == "Directory" and attrs.content is not None:
        problem = "content: a Directory has no content"
    elif attrs.kind != "Service" and attrs.enabled is not None:
        problem = "enabled: only a Service is enabled"
    elif attrs.kind != "Service" and (attrs.active is not None or attrs.restart_on):
        problem = "active: only a Service is started, stopped or restarted"
    elif attrs.kind == "Service" and not _UNIT_PATH.match(attrs.path):
        problem = "path: a Service's unit file is <root>/etc/systemd/system/<name>.<unit type>"
    elif attrs.restart_on and attrs.active is None:
        problem = "restartOn: restarts need active: true (a running systemd)"
    elif attrs.active is not None and systemctl_args(attrs.path)[0] != "--root=/":
        problem = "active: a running systemd's units are under /etc/systemd/system"
    if problem:
        raise InvalidInput(f"{resource.id}: attributes.{problem}", resource_id=resource.id)
    return attrs


_UNIT_PATH = re.compile(
    r"^(?P<root>(/[^/]+)*)/etc/systemd/system/"
    r"(?P<unit>[A-Za-z0-9:_.@-]+\.(service|socket|timer|path|mount|target))$"
)


def systemctl_args(path: str) -> tuple[str, str]:
    """A Service's ``--root=`` (the directory its ``etc/systemd/system`` is in) and unit."""
    found = _UNIT_PATH.match(path)
    assert found is not None  # checked by parse_attributes
    return f"--root={found['root'] or '/'}", found["unit"]


def desired_state(attrs: OnPremAttributes) -> Attributes:
    """The live shape a resource converges to (what read() returns after apply())."""
    state: Attributes = {"kind": attrs.kind, "path": attrs.path, "mode": attrs.normalised_mode()}
    if attrs.kind != "Directory":
        state["content"] = attrs.content or ""
    if attrs.kind == "Service":
        state["enabled"] = attrs.enabled is not False
        if attrs.active is not None:
            state["active"] = attrs.active
        if attrs.restart_on:
            state["restartOn"] = restart_stamp(attrs.restart_on)
    if attrs.host:
        state["host"] = attrs.host
    return state


def restart_stamp(resolved: list[Any] | str) -> str:
    """What a Service's ``restartOn`` resources were when it was last applied: a digest of
    their live states (a change to any restarts the unit once); a recorded one as it is."""
    if isinstance(resolved, str):
        return resolved
    text = json.dumps(resolved, sort_keys=True, default=str).encode()
    return "sha256:" + hashlib.sha256(text).hexdigest()[:16]


Call = Callable[[], Coroutine[Any, Any, None]]
"""One job's step, as :meth:`Filesystem.each` runs it."""


class Stat(NamedTuple):
    mode: int
    size: int


class Staged(Protocol):
    """A file's new content, written beside it under a temporary name derived from its own
    (a write cut short by a killed worker leaves nothing behind once the retried write of the
    same file completes). :meth:`durable` waits for it to be on disk, :meth:`commit` renames
    it over the target."""

    async def durable(self) -> None: ...
    async def commit(self) -> None: ...
    async def discard(self) -> None: ...


class Dir(Protocol):
    """A checked path's parent directory, opened once per batch (names are its entries)."""

    async def stat(self, name: str) -> Stat | None: ...
    async def read(self, name: str, limit: int) -> tuple[Stat, bytes] | None:
        """The object there (a symlink not followed) and, if a regular file of at most
        ``limit`` bytes, up to ``limit + 1`` of its bytes; None: nothing is there."""

    async def stage(self, name: str, tmp: str, data: bytes, mode: int) -> Staged: ...
    async def chmod(self, name: str, mode: int, *, directory: bool) -> None: ...
    async def mkdir(self, name: str) -> None: ...
    async def unlink(self, name: str) -> None: ...
    async def rmdir(self, name: str) -> None: ...
    async def sync(self) -> None: ...
    def close(self) -> None: ...


class Filesystem(Protocol):
    """Where paths live: this machine (:mod:`.local`) or a host over SFTP (:mod:`.sftp`)."""

    key: str
    """The host as paths are owned on it ("" for this machine)."""
    concurrency: int
    """How many calls of a batch may wait on it at once."""

    def each(self, calls: Sequence[Call]) -> None:
        """Each call (each catches its own failure), up to ``concurrency`` at once; returns
        when all are done. The steps of a batch are coroutines, so that a host's calls of a
        step are one hop to its connection's event loop (:mod:`.sftp`); this machine's never
        wait on a loop and run in this thread (:mod:`.local`)."""

    async def open_parent(self, where: Confined, create: bool) -> Dir | None:
        """The real parent directory (None: it does not exist and ``create`` is false; with
        ``create``, missing directories are made)."""

    async def systemctl(self, *args: str) -> tuple[int, str]:
        """``systemctl`` run there: its exit status and output."""


class Confined:
    """One checked path, acted on through its real parent directory on its filesystem."""

    def __init__(
        self, resource_id: str, target: OnPremTarget, policy: WorkerPolicy, fs: Filesystem
    ) -> None:
        self.resource_id = resource_id
        self.target = target
        self.policy = policy
        self.fs = fs

    def refuse(self, problem: str) -> PolicyViolation:
        return PolicyViolation(
            self.resource_id, "attributes.path", f"{self.target.path}: {problem}"
        )

    async def read_in(self, parent: Dir, *, content: bool = True) -> Attributes | None:
        """The object there (``content=False``: its kind and mode only, nothing read)."""
        path, name = self.target.path, self.target.name
        if not content:
            st = await parent.stat(name)
            if st is None:
                return None
            return {"kind": _kind(st.mode), "path": path, "mode": f"{stat.S_IMODE(st.mode):04o}"}
        found = await parent.read(name, int(self.policy.onprem.max_bytes))
        if found is None:
            return None
        st, data = found
        mode = f"{stat.S_IMODE(st.mode):04o}"
        if _kind(st.mode) != "File":
            return {"kind": _kind(st.mode), "path": path, "mode": mode}
        for size in (st.size, len(data)):
            what = f"the file at {path}"
            check_size(self.policy, self.resource_id, "attributes.path", size, what)
        text = data.decode("utf-8", errors="replace")
        return {"kind": "File", "path": path, "mode": mode, "content": text}

    async def stage(self, parent: Dir, content: str, mode: int) -> Staged:
        """The new content under the temporary name, on its way to the disk."""
        name = self.target.name
        tmp = f".stackflow-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        return await parent.stage(name, tmp, content.encode("utf-8"), mode)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "Directory"
    return "File" if stat.S_ISREG(mode) else "Other"


_PERMANENT_ERRNOS = {errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ELOOP}
_REFUSED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def os_errors(resource_id: str, action: str) -> Iterator[None]:
    """Filesystem errors retrying cannot fix are bad input when the worker (its SSH user)
    may not write there (no permission, read-only) and a Conflict when something else is in
    the way (a parent that is a file); anything else (disk full, I/O error) stays retryable
    as Unavailable."""
    try:
        yield
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        message = f"{resource_id}: cannot {action}{where}: {exc.strerror or exc}"
        if exc.errno in _REFUSED_ERRNOS:
            raise InvalidInput(message, resource_id=resource_id) from None
        if exc.errno in _PERMANENT_ERRNOS:
            raise Conflict(message, resource_id=resource_id) from None
        raise Unavailable(message, resource_id=resource_id) from None
