"""Hosts reached over SSH: the other :class:`~.files.Filesystem` (the first is :mod:`.local`).

A batch (:mod:`.batch`) uses one connection per host it touches (asyncssh, keepalives,
SFTP requests of up to ``ssh_concurrency`` of its calls in flight on it), made on first use
and shared with the batches running meanwhile; it is closed ``IDLE`` seconds after the last
batch using it ended (a broken one is made anew by the next batch). The connection uses
the worker user's OpenSSH files as ``ssh`` does (~/.ssh/config,
~/.ssh/known_hosts, the agent, the default keys) unless the policy names others. The host
key must be in the known-hosts file: an unknown or changed key is bad input (exit 2) naming
the host, never trusted on first use. A host that cannot be reached is ``Unavailable``
(retried within the run's bound).

A path is checked on the host itself: its parent resolved by the server (``realpath``, so
through symlinks) must be inside one of the host's roots. Writes are as local ones: the
content under a temporary name, ``fsync@openssh.com``, ``posix-rename@openssh.com`` over the
target, the directory fsynced. Unlike the local filesystem, SFTP has no descriptor-relative
calls: a symlink swapped in on the host between the check and the write is not detected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import posixpath
import shlex
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncssh

from stackflow.runtimes.base import InvalidInput, RuntimeFailure, Unavailable
from stackflow.runtimes.file_roots import OnPremTarget
from stackflow.runtimes.onprem.files import Call, Confined, Stat
from stackflow.runtimes.onprem.hosts import Host, host_roots, parse_host
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy
from stackflow.runtimes.policy_paths import within

T = TypeVar("T")
CONNECT_TIMEOUT = 15.0
CALL_TIMEOUT = 60.0
KEEPALIVE = 15.0
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com")
"""AES-GCM first: one call into OpenSSL per packet in asyncssh, where its ChaCha20 makes
several (the same ciphers OpenSSH offers, in another order)."""

_ERRNOS = {
    asyncssh.FX_NO_SUCH_FILE: errno.ENOENT,
    asyncssh.FX_PERMISSION_DENIED: errno.EACCES,
    asyncssh.FX_FILE_ALREADY_EXISTS: errno.EEXIST,
    asyncssh.FX_NOT_A_DIRECTORY: errno.ENOTDIR,
    asyncssh.FX_DIR_NOT_EMPTY: errno.ENOTEMPTY,
}

_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_loop_lock = threading.Lock()


def _ssh_loop() -> asyncio.AbstractEventLoop:
    """The event loop this process's SSH connections live on (a thread of its own: a batch
    runs in a worker thread, its calls waiting on the loop); a forked child makes its own."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="stackflow-ssh", daemon=True).start()
            _loop = (os.getpid(), loop)
            _links.clear()
        return _loop[1]


Connected = tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]


@dataclass
class _Link:
    """A connection the batches of this process share while they run (and ``IDLE`` seconds
    after the last one ended), on the SSH loop only."""

    task: asyncio.Future[Connected]
    users: int = 0
    idle: asyncio.TimerHandle | None = None

    def usable(self) -> bool:
        task = self.task
        if not task.done():
            return True
        if task.cancelled() or task.exception() is not None:
            return False
        return not task.result()[0].is_closed()


IDLE = 30.0
_links: dict[tuple[object, ...], _Link] = {}


async def _acquire(
    key: tuple[object, ...], connect: Callable[[], Awaitable[Connected]]
) -> Connected:
    link = _links.get(key)
    if link is None or not link.usable():
        link = _links[key] = _Link(asyncio.ensure_future(connect()))
    link.users += 1
    if link.idle is not None:
        link.idle.cancel()
        link.idle = None
    try:
        return await asyncio.shield(link.task)
    except BaseException:
        _release(key, link)
        raise


def _release(key: tuple[object, ...], link: _Link) -> None:
    link.users -= 1
    if link.users <= 0 and _links.get(key) is link:
        link.idle = asyncio.get_running_loop().call_later(IDLE, _close_idle, key, link)


def _close_idle(key: tuple[object, ...], link: _Link) -> None:
    if link.users <= 0 and _links.get(key) is link:
        del _links[key]
        if link.usable() and link.task.done():
            link.task.result()[0].close()


def close_idle() -> None:
    """Closes the connections no batch is using (a runtime closing)."""
    if _loop is None or _loop[0] != os.getpid():
        return

    async def close() -> None:
        for key, link in list(_links.items()):
            if link.idle is not None:
                link.idle.cancel()
            _close_idle(key, link)

    asyncio.run_coroutine_threadsafe(close(), _loop[1]).result(10)


class SshHost:
    """One host for one batch: the process's shared connection to it (made on first use),
    and what the batch learnt of the host (a failure to reach it, resolved paths)."""

    def __init__(self, host: Host, policy: WorkerPolicy) -> None:
        self.host = host
        self.key = host.text
        self.concurrency = policy.onprem.ssh_concurrency
        self._policy = policy
        onprem = policy.onprem
        self._link_key = (host.text, onprem.known_hosts, onprem.ssh_config, onprem.ssh_keys)
        self._lock = threading.Lock()
        self._sftp: asyncssh.SFTPClient | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._pending: concurrent.futures.Future[Connected] | None = None
        self._failed: tuple[type[RuntimeFailure], str] | None = None
        self._real: dict[str, str] = {}

    def connect_soon(self) -> None:
        """Starts connecting (or taking the shared connection), not waiting for it."""
        with self._lock:
            if self._pending is None:
                acquired = _acquire(self._link_key, self._connect)
                self._pending = asyncio.run_coroutine_threadsafe(acquired, _ssh_loop())

    async def _session(self) -> asyncssh.SFTPClient:
        """The SFTP session (on the SSH loop), the connection waited for on first use."""
        if self._sftp is None and self._failed is None:
            self.connect_soon()
            assert self._pending is not None
            pending = asyncio.shield(asyncio.wrap_future(self._pending))
            try:
                self._conn, self._sftp = await asyncio.wait_for(pending, CONNECT_TIMEOUT * 2)
            except Exception as exc:  # classified, kept for the batch's other calls
                self._failed = self._classify(exc)
        if self._failed is not None:
            kind, message = self._failed
            raise kind(message)
        assert self._sftp is not None
        return self._sftp

    async def _connect(self) -> Connected:
        onprem, host = self._policy.onprem, self.host
        options: dict[str, Any] = {
            "encryption_algs": CIPHERS,
            "connect_timeout": CONNECT_TIMEOUT,
            "keepalive_interval": KEEPALIVE,
            "keepalive_count_max": 3,
        }
        if host.port is not None:
            options["port"] = host.port
        if host.user is not None:
            options["username"] = host.user
        if onprem.known_hosts:
            options["known_hosts"] = onprem.known_hosts
        if onprem.ssh_config:
            options["config"] = [onprem.ssh_config]
        if onprem.ssh_keys:
            options["client_keys"] = list(onprem.ssh_keys)
        conn = await asyncssh.connect(host.name, **options)
        try:
            return conn, await conn.start_sftp_client()
        except BaseException:
            conn.close()
            raise

    def _classify(self, exc: BaseException) -> tuple[type[RuntimeFailure], str]:
        where = f"host {self.host.text}"
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            known = self._policy.onprem.known_hosts or "~/.ssh/known_hosts"
            return InvalidInput, (
                f"{where}: its host key is not the one pinned in {known} ({exc.reason}); "
                "check the key and add it there (never trusted on first use)"
            )
        if isinstance(exc, asyncssh.PermissionDenied):
            return InvalidInput, f"{where}: the worker's SSH credentials are refused ({exc.reason})"
        reason = exc.reason if isinstance(exc, asyncssh.Error) else str(exc) or type(exc).__name__
        return Unavailable, f"{where} is unreachable: {reason}"

    async def systemctl(self, *args: str) -> tuple[int, str]:
        async def call(_: asyncssh.SFTPClient) -> tuple[int, str]:
            assert self._conn is not None
            done = await self._conn.run(shlex.join(["systemctl", *args]), check=False)
            out = f"{done.stdout!s}{done.stderr!s}" if done.stdout is not None else ""
            return done.exit_status or 0, out.strip()

        return await self.call(call, "systemctl")

    async def call(self, call: Callable[[asyncssh.SFTPClient], Awaitable[T]], path: str) -> T:
        """``call`` on this host's SFTP session (on the SSH loop); its errors as OSError
        (paths) or a runtime failure naming the host (the connection)."""
        sftp = await self._session()
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                return await call(sftp)
        except asyncssh.SFTPError as exc:
            code = _ERRNOS.get(exc.code, errno.EIO)
            raise OSError(code, f"{exc.reason} (on {self.host.text})", path) from None
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            kind, message = self._classify(exc)
            raise kind(message) from None

    def run(self, call: Callable[[asyncssh.SFTPClient], Awaitable[T]], path: str) -> T:
        """:meth:`call`, from a batch's thread."""
        future = asyncio.run_coroutine_threadsafe(self.call(call, path), _ssh_loop())
        return future.result()

    def each(self, calls: Sequence[Call]) -> None:
        """A step of a batch's jobs on this host: one hop to the SSH loop, where up to
        ``concurrency`` of them run at once."""

        async def run_all() -> None:
            todo = iter(calls)

            async def next_ones() -> None:
                for call in todo:
                    await call()

            await asyncio.gather(*(next_ones() for _ in range(min(self.concurrency, len(calls)))))

        asyncio.run_coroutine_threadsafe(run_all(), _ssh_loop()).result()

    def realpath(self, path: str) -> str:
        """``path`` resolved on the host (through symlinks; what does not exist yet kept as
        written below its nearest existing directory), remembered for the batch."""
        found = self._real.get(path)
        if found is None:
            head, rest = path, ""
            while True:
                try:
                    real = self.run(_realpath(head), head)
                    break
                except FileNotFoundError:
                    if head == "/":
                        raise
                    head, rest = (
                        posixpath.dirname(head),
                        posixpath.join(posixpath.basename(head), rest),
                    )
            found = self._real[path] = posixpath.normpath(posixpath.join(str(real), rest))
        return found

    async def open_parent(self, where: Confined, create: bool) -> SftpDir | None:
        parent = where.target.parent
        st = await self.call(_lstat(parent), parent)
        if st is None or not st.mode & 0o40000:
            if not create:
                return None
            # asyncssh's makedirs tries each component from "/" (two round trips each):
            # only when the directory is not there already
            await self.call(lambda sftp: sftp.makedirs(parent, exist_ok=True), parent)
        return SftpDir(self, parent)

    def close(self) -> None:
        """The batch is done with the connection (closed once no batch used it for a while)."""
        conn, self._conn, self._sftp = self._conn, None, None
        link = _links.get(self._link_key)
        usable = conn is not None and link is not None and link.task.done() and link.usable()
        if usable and link is not None and link.task.result()[0] is conn:  # not made anew
            _ssh_loop().call_soon_threadsafe(_release, self._link_key, link)


def _realpath(path: str) -> Callable[[asyncssh.SFTPClient], Awaitable[object]]:
    return lambda sftp: sftp.realpath(path)


def _lstat(path: str) -> Callable[[asyncssh.SFTPClient], Awaitable[Stat | None]]:
    async def call(sftp: asyncssh.SFTPClient) -> Stat | None:
        try:
            attrs = await sftp.lstat(path)
        except asyncssh.SFTPNoSuchFile:
            return None
        return Stat(attrs.permissions or 0, attrs.size or 0)

    return call


@dataclass
class SftpStaged:
    host: SshHost
    tmp: str
    path: str
    handle: asyncssh.SFTPClientFile | None

    async def durable(self) -> None:
        """Durable already: the host waited for the disk before the batch's next step
        (``fsync@openssh.com`` right after the write, in the same exchange)."""

    async def commit(self) -> None:
        handle, self.handle = self.handle, None

        async def rename(sftp: asyncssh.SFTPClient) -> None:
            closing = handle.close() if handle is not None else asyncio.sleep(0)
            await asyncio.gather(closing, sftp.posix_rename(self.tmp, self.path))

        await self.host.call(rename, self.path)

    async def discard(self) -> None:
        handle, self.handle = self.handle, None

        async def drop(sftp: asyncssh.SFTPClient) -> None:
            if handle is not None:
                await handle.close()
            with contextlib.suppress(asyncssh.SFTPError):
                await sftp.remove(self.tmp)

        # the host gone: the next write of this file replaces what is left
        with contextlib.suppress(OSError, RuntimeFailure):
            await self.host.call(drop, self.tmp)


class SftpDir:
    """A directory on a host, by its real path."""

    def __init__(self, host: SshHost, path: str) -> None:
        self.host = host
        self.path = path

    def _at(self, name: str) -> str:
        return posixpath.join(self.path, name)

    async def stat(self, name: str) -> Stat | None:
        return await self.host.call(_lstat(self._at(name)), self._at(name))

    async def read(self, name: str, limit: int) -> tuple[Stat, bytes] | None:
        path = self._at(name)

        async def call(sftp: asyncssh.SFTPClient) -> tuple[Stat, bytes] | None:
            found = await _lstat(path)(sftp)
            if found is None or not found.mode & 0o100000 or found.size > limit:
                return None if found is None else (found, b"")
            try:
                # one read request (no reader tasks) when the server answers it whole
                block = 0 if found.size < sftp.limits.max_read_len else -1
                handle = await sftp.open(path, asyncssh.FXF_READ, encoding=None, block_size=block)
            except asyncssh.SFTPNoSuchFile:
                return None
            try:
                # the size lstat saw and one byte more (asyncssh reads a larger size as many
                # requests at once); the rest up to the limit only if it grew meanwhile (a
                # server answers a read with at most its own maximum: until one reads nothing)
                want = found.size + 1
                data = await handle.read(want)
                while want <= len(data) <= limit:
                    more = await handle.read(limit + 1 - len(data), len(data))
                    if not more:
                        break
                    data += more
            finally:
                await handle.close()
            return found, data if isinstance(data, bytes) else data.encode()

        return await self.host.call(call, path)

    async def stage(self, name: str, tmp: str, data: bytes, mode: int) -> SftpStaged:
        path, at = self._at(name), self._at(tmp)
        flags = asyncssh.FXF_WRITE | asyncssh.FXF_CREAT | asyncssh.FXF_EXCL

        async def call(sftp: asyncssh.SFTPClient) -> asyncssh.SFTPClientFile:
            attrs = asyncssh.SFTPAttrs(permissions=0o600)
            # block_size=0: each write below is one request, sent when its task starts
            opening = functools.partial(sftp.open, at, flags, attrs, encoding=None, block_size=0)
            try:
                handle = await opening()
            except asyncssh.SFTPFailure:  # left by a write that was killed mid-way
                await sftp.remove(at)
                handle = await opening()
            size = sftp.limits.max_write_len
            writes = [handle.write(data[i : i + size], i) for i in range(0, len(data), size)]
            try:
                # the writes, the mode and the fsync sent at once, in this order (gather
                # starts its tasks in order): a server processes the requests on one file in
                # the order received, as if each waited for the one before (the SFTP draft's
                # "request synchronization"), so the fsync finds every write done
                await asyncio.gather(*writes, handle.chmod(mode), handle.fsync())
            except BaseException:
                await handle.close()
                raise
            return handle

        return SftpStaged(self.host, at, path, await self.host.call(call, at))

    async def chmod(self, name: str, mode: int, *, directory: bool) -> None:
        path = self._at(name)
        # lsetstat@openssh.com: a symlink swapped in is not followed
        await self.host.call(lambda sftp: sftp.chmod(path, mode, follow_symlinks=False), path)

    async def mkdir(self, name: str) -> None:
        path = self._at(name)
        try:
            await self.host.call(lambda sftp: sftp.mkdir(path), path)
        except OSError:
            st = await self.stat(name)
            if st is None or not st.mode & 0o40000:
                raise

    async def unlink(self, name: str) -> None:
        await self.host.call(lambda sftp: sftp.remove(self._at(name)), self._at(name))

    async def rmdir(self, name: str) -> None:
        path = self._at(name)
        try:
            await self.host.call(lambda sftp: sftp.rmdir(path), path)
        except OSError as exc:  # OpenSSH says only "Failure" for a directory not empty
            raise OSError(errno.ENOTEMPTY, exc.strerror, path) from None

    async def sync(self) -> None:
        """The directory's entries made durable: ``fsync@openssh.com`` on the directory,
        opened read-only (as ``open(2)`` allows on Linux)."""

        async def call(sftp: asyncssh.SFTPClient) -> None:
            handle = await sftp.open(self.path, asyncssh.FXF_READ, encoding=None)
            try:
                await handle.fsync()
            finally:
                await handle.close()

        await self.host.call(call, self.path)

    def close(self) -> None:
        """Nothing held open on the host."""


class Hosts:
    """A batch's connections: one per host, opened when first needed, closed with it."""

    def __init__(self) -> None:
        self._open: dict[str, SshHost] = {}
        self._lock = threading.Lock()

    def get(self, text: str, policy: WorkerPolicy) -> SshHost:
        """The connection to ``text`` (its settings are the worker's, whatever the project)."""
        with self._lock:
            found = self._open.get(text)
            if found is None:
                found = self._open[text] = SshHost(parse_host(text), policy)
            return found

    def close(self) -> None:
        for host in self._open.values():
            with contextlib.suppress(Exception):  # closing what may be broken already
                host.close()
        self._open.clear()


def host_target(policy: WorkerPolicy, resource_id: str, path: str, host: SshHost) -> OnPremTarget:
    """Where ``path`` lives on ``host``: its parent as the host resolves it, inside one of
    the host's roots (resolved the same way)."""
    roots = host_roots(policy, resource_id, host.host, path)
    lexical = posixpath.normpath(path)
    name = posixpath.basename(lexical)
    if not name:
        raise PolicyViolation(resource_id, "attributes.path", f"{path} names no file")
    parent = host.realpath(posixpath.dirname(lexical))
    real = posixpath.join(parent, name)
    for root in roots:
        resolved = host.realpath(root)
        if within(real, resolved):
            return OnPremTarget(path=lexical, anchor=resolved, parent=parent, name=name)
    raise PolicyViolation(
        resource_id,
        "attributes.path",
        f"{path} is outside this worker's roots on {host.key} ({', '.join(roots)}) "
        f"(it resolves to {real})",
    )
