"""A batch of OnPrem calls, run together in one thread, each with its own outcome.

A batch is as durable as one call at a time, with far fewer waits for the disk: every file's
new content is written under its temporary name first (its write-back started), then each is
made durable, then each is renamed over its target, and each directory that changed is
synced once, not once per file. Each parent directory is opened (walked from its root
without following symlinks) once per batch, and each directory path resolved once.

Calls on the same path run in order, in rounds: a path appears at most once per round.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stackflow.runtimes.base import Attributes, Conflict, ResourceRequest, RuntimeOptions
from stackflow.runtimes.file_roots import onprem_target
from stackflow.runtimes.onprem.files import (
    Confined,
    OnPremAttributes,
    Staged,
    desired_state,
    os_errors,
    parse_attributes,
)
from stackflow.runtimes.onprem.policy import check_content
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


def place(
    policy: WorkerPolicy,
    resource: ResourceRequest,
    *,
    reading: bool = True,
    content: bool = True,
    resolve: Resolve = real_path,
) -> tuple[OnPremAttributes, Confined]:
    """The attributes, checked against the policy (path, content size, size of the file
    there), and where the path really lives."""
    attrs = parse_attributes(resource)
    target = onprem_target(
        policy,
        resource.id,
        attrs.path,
        directory=attrs.kind == "Directory",
        reading=reading,
        resolve=resolve,
    )
    if content:
        check_content(policy, resource.id, attrs.content)
    return attrs, Confined(resource.id, target, policy)


class Parents:
    """The batch's parent directories: each opened once, each that changed synced once."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._missing: set[str] = set()
        """Parents found missing (read, delete), until a call creates directories."""
        self._changed: dict[str, list[FileJob]] = {}

    def get(self, where: Confined, *, create: bool) -> int | None:
        key = where.target.parent
        fd = self._open.get(key)
        if fd is not None:
            return fd
        if create:
            self._missing.clear()
        elif key in self._missing:
            return None
        fd = where.open_parent(create)
        if fd is None:
            self._missing.add(key)
        else:
            self._open[key] = fd
        return fd

    def changed(self, job: FileJob) -> None:
        assert job.where is not None
        self._changed.setdefault(job.where.target.parent, []).append(job)

    def sync(self) -> None:
        """Each changed directory synced once; a directory that cannot be fails its jobs."""
        for key, jobs in self._changed.items():
            try:
                os.fsync(self._open[key])
            except OSError as exc:
                for job in jobs:
                    job.fail(exc)
        self._changed.clear()

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
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

    @property
    def key(self) -> str:
        assert self.where is not None
        return self.where.target.real

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            try:
                with os_errors(self.request.id, self.verb):
                    raise exc
            except BaseException as classified:  # kept as the job's outcome
                self.error = classified
        if self.staged is not None:
            self.staged.discard()
            self.staged = None

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
    def check(self, policy: WorkerPolicy, resolve: Resolve) -> None:
        self.attrs, self.where = place(
            policy, self.request, reading=self.reading, content=self.content, resolve=resolve
        )

    def start(self, parents: Parents) -> None:
        """Reads, deletes, or writes the new content under its temporary name."""
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        if self.verb == "check":
            return
        if self.verb == "read":
            fd = parents.get(where, create=False)
            self.result = None if fd is None else where.read_in(fd)
            if self.result is not None and attrs.host:
                self.result["host"] = attrs.host
        elif self.verb == "delete":
            self._delete(parents)
        else:
            self._apply(parents)

    def _apply(self, parents: Parents) -> None:
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        rid = self.request.id
        want = desired_state(attrs)
        mode = int(want["mode"], 8)
        fd = parents.get(where, create=True)
        assert fd is not None
        live = where.read_in(fd)
        if live is not None and live["kind"] != attrs.kind:
            raise Conflict(
                f"{rid}: {attrs.path} exists as a {live['kind']}, not a {attrs.kind}; "
                "remove it or change the path",
                resource_id=rid,
            )
        if attrs.kind == "File":
            if live is None or live.get("content") != want["content"]:
                self.staged = where.stage(fd, want["content"], mode)
            elif live["mode"] != want["mode"]:
                where.chmod(fd, mode, directory=False)
        else:
            if live is None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(where.target.name, 0o777, dir_fd=fd)
                parents.changed(self)
            where.chmod(fd, mode, directory=True)
        # what is there once the batch is durable: exactly what was asked (written or
        # found), so it is not read back
        self.result = want

    def _delete(self, parents: Parents) -> None:
        where, attrs = self.where, self.attrs
        assert where is not None and attrs is not None
        rid = self.request.id
        fd = parents.get(where, create=False)
        if fd is None:
            return
        live = where.read_in(fd, content=False)
        if live is None:
            return
        if live["kind"] != attrs.kind:
            raise Conflict(
                f"{rid}: {attrs.path} is a {live['kind']}, not the {attrs.kind} "
                "stackflow made; left in place",
                resource_id=rid,
            )
        if attrs.kind == "File":
            os.unlink(where.target.name, dir_fd=fd)
        else:
            try:
                os.rmdir(where.target.name, dir_fd=fd)
            except OSError as exc:
                raise Conflict(
                    f"{rid}: directory {attrs.path} is not empty (it holds files no "
                    f"resource of this stack deletes first): {exc.strerror}",
                    resource_id=rid,
                ) from None
        parents.changed(self)

    def commit(self, parents: Parents) -> None:
        """The durable new content renamed over the target."""
        if self.staged is not None:
            staged, self.staged = self.staged, None
            try:
                staged.commit()
            except BaseException:
                staged.discard()
                raise
            parents.changed(self)


def run_batch(jobs: Sequence[FileJob], policy: WorkerPolicy) -> None:
    """Runs every job (in a worker thread); each one's outcome is left on it. What it wrote
    or deleted is on disk, durably, when this returns."""
    check_batch(jobs, policy)
    run_checked(jobs)


def check_batch(jobs: Sequence[FileJob], policy: WorkerPolicy) -> None:
    """Each job's path checked against its policy (else ``policy``); a refusal is its
    outcome."""
    resolve = remembering()
    for job in jobs:
        with job.step() as going:
            if going:
                job.check(job.policy or policy, resolve)


def run_checked(jobs: Sequence[FileJob]) -> None:
    """As :func:`run_batch`, for jobs whose paths are checked already (``where`` set)."""
    queue = [job for job in jobs if job.error is None and job.verb != "check"]
    while queue:
        seen: set[str] = set()
        now: list[FileJob] = []
        later: list[FileJob] = []
        for job in queue:
            (later if job.key in seen else now).append(job)
            seen.add(job.key)
        _round(now)
        queue = later


def _round(jobs: list[FileJob]) -> None:
    """One round: paths all different; the disk waited for once per step, not per file."""
    parents = Parents()
    try:
        for job in jobs:
            with job.step() as going:
                if going:
                    job.start(parents)
        for job in jobs:
            with job.step() as going:
                if going and job.staged is not None:
                    job.staged.durable()
        for job in jobs:
            with job.step() as going:
                if going:
                    job.commit(parents)
        parents.sync()
    finally:
        for job in jobs:
            if job.staged is not None:
                job.staged.discard()
                job.staged = None
        parents.close()
