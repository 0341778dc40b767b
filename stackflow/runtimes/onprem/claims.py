"""OnPrem paths belong to one stack: what another stack recorded is refused as a conflict.

Files carry no owner of their own (Kubernetes objects carry ``stackflow.io/project``), so
the state backend keeps one (:class:`~stackflow.state.protocols.PathClaims`): a batch's
applies claim their real paths before anything is written, and its reads, previews and
deletes look the owners up; a path another stack owns fails that call with ``OwnedElsewhere``
(exit 3), one line naming the path and the stack. A delete gives the path up.
"""

from __future__ import annotations

from collections.abc import Sequence

from stackflow.core.refs import RunRef, StackRef
from stackflow.runtimes.base import OwnedElsewhere
from stackflow.runtimes.onprem.batch import FileJob
from stackflow.state.path_claims import PathOwner
from stackflow.state.protocols import PathClaims

Group = tuple[StackRef, int | None, RunRef | None]


def _groups(jobs: Sequence[FileJob]) -> dict[Group, list[FileJob]]:
    """The checked jobs by (stack, release, run): each group's claims are one write."""
    out: dict[Group, list[FileJob]] = {}
    for job in jobs:
        if job.error is None and job.where is not None and job.options is not None:
            o = job.options
            out.setdefault((o.stack, o.revision, o.owner), []).append(job)
    return out


def _refuse(job: FileJob, owner: PathOwner) -> None:
    rid = job.request.id
    path = job.attrs.path if job.attrs is not None else job.key
    shown = path if path == job.key else f"{path} ({job.key})"
    job.fail(
        OwnedElsewhere(
            f"{rid}: {shown} is owned by stack {owner.stack} (its resource "
            f"{owner.resource_id}); a path belongs to one stack: remove it from that stack first",
            resource_id=rid,
        )
    )


class Claims:
    """A batch's claims on the state backend (see the module's doc)."""

    def __init__(self, store: PathClaims) -> None:
        self.store = store

    def before(self, jobs: Sequence[FileJob]) -> None:
        """Applies claim their paths; every other call looks its owner up. A path another
        stack owns fails its job (nothing of it runs)."""
        for (stack, revision, run), group in _groups(jobs).items():
            applies = [job for job in group if job.verb == "apply"]
            if applies:
                claims = {job.key: job.request.id for job in applies}
                held = self.store.claim_paths(stack, claims, revision=revision, run=run)
                for job in applies:
                    if job.key in held:
                        _refuse(job, held[job.key])
            others = [job for job in group if job.verb != "apply"]
            if others:
                owners = self.store.path_owners(stack, [job.key for job in others])
                for job in others:
                    if job.key in owners:
                        _refuse(job, owners[job.key])

    def after(self, jobs: Sequence[FileJob]) -> None:
        """Deleted paths are given up."""
        for (stack, revision, run), group in _groups(jobs).items():
            deleted = [job.key for job in group if job.verb == "delete"]
            if deleted:
                self.store.release_paths(stack, deleted, revision=revision, run=run)
