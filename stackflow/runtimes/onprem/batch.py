"""A batch of OnPrem calls, run together in one thread, each with its own outcome.

A batch is as durable as one call at a time, with far fewer waits for the disk: every file's
new content is written under its temporary name first (its write-back started), then each is
made durable, then each is renamed over its target, and each directory that changed is
synced once, not once per file. Each parent directory is opened (walked from its root
without following symlinks) once per batch, and each directory path resolved once.

Calls on the same path run in order, in rounds: a path appears at most once per round.
Paths on hosts reached over SSH (:mod:`.sftp`) go through the same steps on that host's
connection, up to its ``concurrency`` calls at once; each host's calls run beside the others'
(one slow host holds no other).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from stackflow.runtimes.base import Attributes, Conflict, ResourceRequest, RuntimeOptions
from stackflow.runtimes.file_roots import onprem_target
from stackflow.runtimes.onprem.files import (
    LOCAL_HOSTS,
    Confined,
    Dir,
    Filesystem,
    OnPremAttributes,
    Staged,
    desired_state,
    os_errors,
    parse_attributes,
    systemctl_args,
)
from stackflow.runtimes.onprem.hosts import host_roots, parse_host
from stackflow.runtimes.onprem.local import LOCAL
from stackflow.runtimes.onprem.policy import check_content
from stackflow.runtimes.onprem.sftp import Hosts, host_target
from stackflow.runtimes.policy import WorkerPolicy
from stackflow.runtimes.policy_paths import real_path

Verb = Literal["check", "read", "apply", "delete"]
Resolve = Callable[[str], str]

BATCH_LIMIT = 128
"""The most calls one batch runs (each may hold a temporary file open until it is durable)."""


def remembering() -> Resolve:
    """``real_path`` for one batch's (or one check's) lookups: each directory resolved once,
    nothing kept past it."""
    return functools.lru_cache(maxsize=None)(real_path)


def check(
    policy: WorkerPolicy,
    resource: ResourceRequest,
    *,
    reading: bool = True,
    content: bool = True,
    resolve: Resolve = real_path,
) -> OnPremAttributes:
    """The attributes, checked against the policy without reaching any host (a host's path
    as written)."""
    attrs = parse_attributes(resource)
    if attrs.host in LOCAL_HOSTS:
        onprem_target(
            policy,
            resource.id,
            attrs.path,
            directory=attrs.kind == "Directory",
            reading=reading,
            resolve=resolve,
        )
    else:
        host_roots(policy, resource.id, parse_host(attrs.host or ""), attrs.path)
    if content:
        check_content(policy, resource.id, attrs.content)
    return attrs


def place(
    policy: WorkerPolicy,
    resource: ResourceRequest,
    *,
    reading: bool = True,
    content: bool = True,
    resolve: Resolve = real_path,
    hosts: Hosts | None = None,
) -> tuple[OnPremAttributes, Confined]:
    """The attributes, checked against the policy (path, content size, size of the file
    there), and where the path really lives (on a host: as the host resolves it, through
    the batch's ``hosts``)."""
    attrs = parse_attributes(resource)
    if attrs.host in LOCAL_HOSTS or hosts is None:
        target = onprem_target(
            policy,
            resource.id,
            attrs.path,
            directory=attrs.kind == "Directory",
            reading=reading,
            resolve=resolve,
        )
        fs: Filesystem = LOCAL
    else:
        host = hosts.get(attrs.host or "", policy)
        target, fs = host_target(policy, resource.id, attrs.path, host), host
    if content:
        check_content(policy, resource.id, attrs.content)
    return attrs, Confined(resource.id, target, policy, fs)


class Parents:
    """The round's parent directories: each opened once, each that changed synced once."""

    def __init__(self) -> None:
        self._open: dict[str, Dir] = {}
        self._missing: set[str] = set()
        """Parents found missing (read, delete), until a call creates directories."""
        self._changed: dict[str, list[FileJob]] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        """One opening per directory at once (a host's calls of a step run together)."""

    async def get(self, where: Confined, *, create: bool) -> Dir | None:
        key = where.target.parent
        if key in self._open:
            return self._open[key]
        async with self._opening.setdefault(key, asyncio.Lock()):
            found = self._open.get(key)
            if found is not None:
                return found
            if create:
                self._missing.clear()
            elif key in self._missing:
                return None
            found = await where.fs.open_parent(where, create)
            if found is None:
                self._missing.add(key)
            else:
                self._open[key] = found
            return found

    def changed(self, job: FileJob) -> None:
        assert job.where is not None
        self._changed.setdefault(job.where.target.parent, []).append(job)

    async def sync(self) -> None:
        """Each changed directory synced once; a directory that cannot be fails its jobs."""
        for key, jobs in self._changed.items():
            try:
                await self._open[key].sync()
            except Exception as exc:  # each job's failure is its own
                for job in jobs:
                    job.fail(exc)
        self._changed.clear()

    def close(self) -> None:
        for found in self._open.values():
            found.close()
        self._open.clear()


@dataclass
class FileJob:
    """One call of a batch: what it asks, and (after :func:`run_batch`) its outcome."""

    verb: Verb
    request: ResourceRequest
    reading: bool = True
    """The policy's size limit applies to the file there (a delete removes any size)."""
    content: bool = True
    """The policy's size limit applies to the content asked for."""
    options: RuntimeOptions | None = None
    """The run's options (its stack owns the paths it writes)."""
    policy: WorkerPolicy | None = None
    """The worker policy for the run's project (None: the batch's)."""
    attrs: OnPremAttributes | None = None
    where: Confined | None = None
    result: Attributes | None = None
    error: BaseException | None = None
    staged: Staged | None = field(default=None, repr=False)
    enable: bool | None = None
    """A Service's enablement to set once its unit file is written."""
    reload: bool = False
    """A Service's unit file changed under a running systemd: ``daemon-reload`` first."""
    unit_verb: str | None = None
    """``start``, ``stop`` or ``restart`` of a Service's unit, once its files are written."""

    @property
    def key(self) -> str:
        assert self.where is not None
        return self.where.fs.key + self.where.target.real

    def fail(self, exc: BaseException) -> None:
        """``exc`` (classified) is the job's outcome (what it staged is discarded at the end
        of its round)."""
        if self.error is None:
            try:
                with os_errors(self.request.id, self.verb):
                    raise exc
            except BaseException as classified:  # kept as the job's outcome
                self.error = classified

    @contextlib.contextmanager
    def step(self) -> Iterator[bool]:
        """Runs the block unless the job failed already; a failure becomes its outcome."""
        if self.error is not None:
            yield False
            return
        try:
            yield True
        except Exception as exc:  # each call's failure is its own
            self.fail(exc)

    # ---- the steps, in the order run_batch takes them -----------------------------------
    def check(self, policy: WorkerPolicy, resolve: Resolve, hosts: Hosts | None) -> None:
        self.attrs, self.where = place(
            policy,
            self.request,
            reading=self.reading,
            content=self.content,
            resolve=resolve,
            hosts=hosts,
        )

    async def start(self, parents: Parents) -> None:
        """Reads, deletes, or writes the new content under its temporary name."""
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        if self.verb == "check":
            return
        if self.verb == "read":
            parent = await parents.get(where, create=False)
            if parent is not None:
                self.result = await self._as_service(await where.read_in(parent))
            if self.result is not None and attrs.host:
                self.result["host"] = attrs.host
        elif self.verb == "delete":
            await self._delete(parents)
        else:
            await self._apply(parents)

    async def _apply(self, parents: Parents) -> None:
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        rid = self.request.id
        want = desired_state(attrs)
        mode = int(want["mode"], 8)
        parent = await parents.get(where, create=True)
        assert parent is not None
        live = await self._as_service(await where.read_in(parent))
        if live is not None and live["kind"] != attrs.kind:
            raise Conflict(
                f"{rid}: {attrs.path} exists as a {live['kind']}, not a {attrs.kind}; "
                "remove it or change the path",
                resource_id=rid,
            )
        if attrs.kind != "Directory":
            if live is None or live.get("content") != want["content"]:
                self.staged = await where.stage(parent, want["content"], mode)
            elif live["mode"] != want["mode"]:
                await parent.chmod(where.target.name, mode, directory=False)
            if attrs.kind == "Service":
                self._plan_service(live, want)
        else:
            if live is None:
                await parent.mkdir(where.target.name)
                parents.changed(self)
            await parent.chmod(where.target.name, mode, directory=True)
        # what is there once the batch is durable: exactly what was asked (written or
        # found), so it is not read back
        self.result = want

    def _plan_service(self, live: Attributes | None, want: Attributes) -> None:
        """What :meth:`settle` does to a Service once its unit file is in place: enablement,
        and under a running systemd a reload, then a start, stop, or one restart when its
        unit or a ``restartOn`` resource changed."""
        assert self.attrs is not None
        if live is None or live["enabled"] != want["enabled"]:
            self.enable = want["enabled"]
        if self.attrs.active is None:
            return
        running = live is not None and live.get("active") is True
        self.reload = self.staged is not None
        if not self.attrs.active:
            self.unit_verb = "stop" if running else None
        elif not running:
            self.unit_verb = "start"
        elif (
            self.staged is not None
            or live is None
            or live.get("restartOn") != want.get("restartOn")
        ):
            self.unit_verb = "restart"

    async def _delete(self, parents: Parents) -> None:
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        rid = self.request.id
        parent = await parents.get(where, create=False)
        if parent is None:
            return
        live = await where.read_in(parent, content=False)
        if live is None:
            return
        if attrs.kind == "Service" and live["kind"] == "File":
            live["kind"] = "Service"
            if attrs.active is not None:
                await self._unit("stop")
                self.reload = True
            await self._systemctl("disable")
        if live["kind"] != attrs.kind:
            raise Conflict(
                f"{rid}: {attrs.path} is a {live['kind']}, not the {attrs.kind} "
                "stackflow made; left in place",
                resource_id=rid,
            )
        if attrs.kind != "Directory":
            await parent.unlink(where.target.name)
        else:
            try:
                await parent.rmdir(where.target.name)
            except OSError as exc:
                raise Conflict(
                    f"{rid}: directory {attrs.path} is not empty (it holds files no "
                    f"resource of this stack deletes first): {exc.strerror}",
                    resource_id=rid,
                ) from None
        parents.changed(self)

    async def _systemctl(self, verb: str) -> str:
        """``systemctl --root=<root> <verb> <unit>`` where the Service lives."""
        assert self.where is not None
        root, unit = systemctl_args(self.where.target.path)
        code, out = await self.where.fs.systemctl(root, verb, unit)
        if code != 0 and verb != "is-enabled":
            rid = self.request.id
            raise Conflict(f"{rid}: systemctl {verb} {unit}: {out[-300:]}", resource_id=rid)
        return out.splitlines()[-1] if out else ""

    async def _unit(self, verb: str) -> str:
        """``systemctl <verb> <unit>`` to the running systemd where the Service lives."""
        assert self.where is not None
        _, unit = systemctl_args(self.where.target.path)
        args = ("daemon-reload",) if verb == "daemon-reload" else (verb, unit)
        code, out = await self.where.fs.systemctl(*args)
        if code != 0 and verb != "is-active":
            rid = self.request.id
            raise Conflict(f"{rid}: systemctl {' '.join(args)}: {out[-300:]}", resource_id=rid)
        return out.splitlines()[-1] if out else ""

    async def _as_service(self, live: Attributes | None) -> Attributes | None:
        """A Service's unit file as the Service: whether its unit is enabled (and, when
        managed, active) beside it; ``restartOn`` as its last apply recorded it."""
        attrs = self.attrs
        assert attrs is not None
        if attrs.kind == "Service" and live is not None and live["kind"] == "File":
            live.update(kind="Service", enabled=await self._systemctl("is-enabled") == "enabled")
            if attrs.active is not None:
                live["active"] = await self._unit("is-active") == "active"
            if attrs.restart_on:
                live["restartOn"] = (self.request.prior_state or {}).get("restartOn")
        return live

    @property
    def settling(self) -> bool:
        """A Service has something to do once its files are in place."""
        return self.reload or self.enable is not None or self.unit_verb is not None

    async def settle(self) -> None:
        """A Service's unit reloaded, enabled or disabled, started, stopped or restarted (once),
        once its files are in place."""
        if self.reload:
            await self._unit("daemon-reload")
            self.reload = False
        if self.enable is not None:
            await self._systemctl("enable" if self.enable else "disable")
            self.enable = None
        if self.unit_verb is not None:
            verb, self.unit_verb = self.unit_verb, None
            await self._unit(verb)

    async def commit(self, parents: Parents) -> None:
        """The durable new content renamed over the target."""
        if self.staged is not None:
            staged, self.staged = self.staged, None
            try:
                await staged.commit()
            except BaseException:
                await staged.discard()
                raise
            parents.changed(self)


def run_batch(jobs: Sequence[FileJob], policy: WorkerPolicy) -> None:
    """Runs every job (in a worker thread); each one's outcome is left on it. What it wrote
    or deleted is on disk, durably, when this returns."""
    hosts = Hosts()
    try:
        check_batch(jobs, policy, hosts)
        run_checked(jobs)
    finally:
        hosts.close()


def check_batch(jobs: Sequence[FileJob], policy: WorkerPolicy, hosts: Hosts | None) -> None:
    """Each job's path checked against its policy (else ``policy``); a refusal is its
    outcome."""
    resolve = remembering()
    if hosts is not None:  # each allowed host's connection started before any is waited for
        for job in jobs:
            _connect_soon(job, job.policy or policy, hosts)
    for job in jobs:
        with job.step() as going:
            if going:
                job.check(job.policy or policy, resolve, hosts)


def _connect_soon(job: FileJob, policy: WorkerPolicy, hosts: Hosts) -> None:
    host = job.request.attributes.get("host")
    if job.error is None and isinstance(host, str) and host not in LOCAL_HOSTS:
        with contextlib.suppress(Exception):  # the check proper says what is wrong
            attrs = parse_attributes(job.request)
            host_roots(policy, job.request.id, parse_host(host), attrs.path)
            hosts.get(host, policy).connect_soon()


def run_checked(jobs: Sequence[FileJob]) -> None:
    """As :func:`run_batch`, for jobs whose paths are checked already (``where`` set): each
    filesystem's jobs beside the others'."""
    by_fs: dict[int, list[FileJob]] = {}
    for job in jobs:
        if job.error is None and job.verb != "check":
            assert job.where is not None
            by_fs.setdefault(id(job.where.fs), []).append(job)
    groups = list(by_fs.values())
    if len(groups) == 1:
        _rounds(groups[0])
    elif groups:
        with ThreadPoolExecutor(len(groups), thread_name_prefix="onprem-host") as pool:
            list(pool.map(_rounds, groups))


def _rounds(queue: list[FileJob]) -> None:
    while queue:
        seen: set[str] = set()
        now: list[FileJob] = []
        later: list[FileJob] = []
        for job in queue:
            (later if job.key in seen else now).append(job)
            seen.add(job.key)
        _round(now)
        queue = later


def _each(jobs: list[FileJob], step: Callable[[FileJob], Awaitable[object]]) -> None:
    """``step`` of each job still going, on their filesystem (up to its concurrency at once);
    a failure is that job's own."""

    async def one(job: FileJob) -> None:
        with job.step() as going:
            if going:
                await step(job)

    going = [job for job in jobs if job.error is None]
    if going:
        assert going[0].where is not None
        going[0].where.fs.each([functools.partial(one, job) for job in going])


def _round(jobs: list[FileJob]) -> None:
    """One round: paths all different; the disk waited for once per step, not per file."""
    parents = Parents()
    try:
        _each(jobs, lambda job: job.start(parents))
        _each([job for job in jobs if job.staged], lambda job: _staged(job).durable())
        _each([job for job in jobs if job.staged], lambda job: job.commit(parents))
        assert jobs[0].where is not None
        jobs[0].where.fs.each([parents.sync])
        _each([job for job in jobs if job.settling], lambda job: job.settle())
    finally:
        left = [job for job in jobs if job.staged is not None]
        if left:
            assert left[0].where is not None
            left[0].where.fs.each([functools.partial(_discard, job) for job in left])
        parents.close()


def _staged(job: FileJob) -> Staged:
    assert job.staged is not None
    return job.staged


async def _discard(job: FileJob) -> None:
    staged, job.staged = _staged(job), None
    with contextlib.suppress(Exception):  # the job failed already; a host gone keeps it
        await staged.discard()
