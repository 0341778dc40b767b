"""OnPrem runtime, local transport: files and directories on this machine.

Resources of type ``OnPrem`` carry ``attributes.kind`` ``File`` (``path``, ``content``,
``mode``) or ``Directory`` (``path``, ``mode``), and ``host``: none (or ``localhost``) for
this machine, else a host reached over SSH (:mod:`.hosts`, :mod:`.sftp`), held to the roots
the worker policy gives that host. Writes are atomic (temporary file, fsync, rename, fsync
of the directory) and skipped when nothing would change.

Every path is confined by the worker policy (:mod:`stackflow.runtimes.policy`): inside
``STACKFLOW_ONPREM_ROOTS`` once symlinks are resolved, never stackflow's own files, content
and files read at most ``STACKFLOW_ONPREM_MAX_BYTES``. Files are then reached through a
descriptor of their directory, opened from the root without following symlinks, so a
symlink planted after the check is refused rather than followed (:mod:`.files`). A project
with a section of its own in the worker policy is held to that section's roots.

A path belongs to one stack (:mod:`.claims`, kept by the state backend): an apply claims it
before writing, and a preview, read, apply or delete of a path another stack owns fails as
``OwnedElsewhere`` (a ``Conflict``, exit 3) naming the path and that stack; a delete gives
the path up.

Calls made at once (a group's, a preview batch's) run as one batch in one thread
(:mod:`.batch`): one thread hop, each directory opened once, and the disk waited for once
per step of the batch rather than twice per file, with the same durability.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stackflow.runtimes.base import (
    Attributes,
    PreviewResult,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
)
from stackflow.runtimes.onprem.batch import (
    BATCH_LIMIT,
    FileJob,
    Verb,
    check,
    check_batch,
    place,
    remembering,
    run_checked,
)
from stackflow.runtimes.onprem.claims import Claims
from stackflow.runtimes.onprem.files import Confined, OnPremAttributes, desired_state
from stackflow.runtimes.onprem.rules import TYPE_NAME
from stackflow.runtimes.onprem.sftp import Hosts, close_idle
from stackflow.runtimes.policy import WorkerPolicy, worker_policy
from stackflow.runtimes.turns import TurnBatcher

if TYPE_CHECKING:
    from stackflow.state.protocols import PathClaims


def apply_sync(resource_id: str, attrs: OnPremAttributes, where: Confined) -> Attributes:
    """One apply of a path checked already (:meth:`OnPremRuntime._place`), in this thread."""
    request = ResourceRequest(id=resource_id, type=TYPE_NAME, attributes={})
    job = FileJob("apply", request, attrs=attrs, where=where)
    run_checked([job])
    if job.error is not None:
        raise job.error
    assert job.result is not None
    return job.result


class OnPremRuntime(Runtime):
    """Files and directories on this machine or hosts over SSH, inside the policy's roots."""

    type_name = TYPE_NAME
    checks_every_call = True  # every call starts with the policy on that very path
    coalesces_calls = True  # calls made at once run as one batch (see the module's doc)

    def __init__(
        self, policy: WorkerPolicy | None = None, claims: PathClaims | None = None
    ) -> None:
        self._policy = policy
        self._claims = Claims(claims) if claims is not None else None
        """Who owns each path (the state backend); None: nothing checks ownership."""
        self._batches: TurnBatcher[FileJob] = TurnBatcher(self._run, BATCH_LIMIT)

    @property
    def policy(self) -> WorkerPolicy:
        return self._policy if self._policy is not None else worker_policy()

    def _run(self, jobs: list[FileJob]) -> None:
        hosts = Hosts()  # one connection per host for the batch
        try:
            check_batch(jobs, self.policy, hosts)
            if self._claims is not None:
                self._claims.before(jobs)
            run_checked(jobs)
            if self._claims is not None:
                self._claims.after(jobs)
        finally:
            hosts.close()

    async def _call(
        self,
        verb: Verb,
        resource: ResourceRequest,
        options: RuntimeOptions,
        *,
        reading: bool = True,
        content: bool = True,
    ) -> FileJob:
        policy = self.policy.for_project(options.project, resource.id)
        job = FileJob(
            verb, resource, reading=reading, content=content, options=options, policy=policy
        )
        await self._batches.submit(job)
        if job.error is not None:
            raise job.error
        return job

    def _place(self, resource: ResourceRequest) -> tuple[OnPremAttributes, Confined]:
        """The path checked against the worker's own policy (no project's)."""
        return place(self.policy, resource)

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        check(self.policy.for_project(options.project, resource.id), resource)

    def check_policies(self, resources: Sequence[ResourceRequest], options: RuntimeOptions) -> None:
        resolve = remembering()
        for resource in resources:
            check(self.policy.for_project(options.project, resource.id), resource, resolve=resolve)

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return (await self._call("read", resource, options)).result

    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        job = await self._call("check", resource, options)
        assert job.attrs is not None
        return PreviewResult(would_be=desired_state(job.attrs))

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """The file as it is and what it would become, from one policy check and one look."""
        job = await self._call("read", resource, options)
        assert job.attrs is not None
        preview = PreviewResult(would_be=desired_state(job.attrs)) if with_preview else None
        return job.result, preview

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        job = await self._call("apply", resource, options)
        assert job.result is not None
        return job.result

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        # what is recorded is deleted whatever its size; the path is checked
        await self._call("delete", resource, options, reading=False, content=False)

    async def close(self) -> None:
        await asyncio.to_thread(close_idle)
