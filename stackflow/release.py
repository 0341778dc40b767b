"""Releases: one record per revision of a stack (project/workspace), as Kusion keeps them.

The stack lock is a property of the latest release: while it is in a non-final phase no new
release may start. While applying, per-resource state goes to an append-only journal beside
the release (one durable line per resource) instead of rewriting the release per node; reads
fold the journal in, and a final phase writes the folded state into the release.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from stackflow.errors import (
    ConflictError,
    NotFoundError,
    OwnerConflictError,
    PhaseConflictError,
    StackLockedError,
)
from stackflow.spec import Resource, Spec
from stackflow.store.base import Metadata, Record, RecordStore, now

RELEASE_TYPE = "Release"
_CREATE_ATTEMPTS = 1000


class Operation(StrEnum):
    apply = "apply"
    destroy = "destroy"


class Phase(StrEnum):
    """Kusion's release phases."""

    generating = "generating"
    previewing = "previewing"
    applying = "applying"
    destroying = "destroying"
    succeeded = "succeeded"
    failed = "failed"

    @property
    def is_final(self) -> bool:
        return self in (Phase.succeeded, Phase.failed)


class Decision(StrEnum):
    approved = "approved"
    rejected = "rejected"


class Approval(BaseModel):
    decision: Decision
    by: str
    at: datetime
    reason: str | None = None


class State(BaseModel):
    """Resources as applied, with their live attributes."""

    model_config = ConfigDict(extra="ignore")

    resources: list[Resource] = Field(default_factory=list)

    def by_id(self) -> dict[str, Resource]:
        return {r.id: r for r in self.resources}


class Release(BaseModel):
    """A release; reads Kusion's files too (``createTime``, ``modifiedTime``, ``stack``)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    project: str
    workspace: str
    revision: int
    stack: str | None = None
    operation: Operation = Operation.apply  # Kusion's releases have none: they were applies
    phase: Phase
    spec: Spec | None = None
    state: State = Field(default_factory=State)
    error: str | None = None
    approval: Approval | None = None
    changes: dict[str, Any] | None = None
    workflow_id: str | None = None
    """The Temporal workflow that runs this release (None for imported/Kusion releases)."""
    run_id: str | None = None
    created_at: datetime = Field(validation_alias=AliasChoices("created_at", "createTime"))
    modified_at: datetime = Field(validation_alias=AliasChoices("modified_at", "modifiedTime"))


def fold_journal(resources: list[Resource], entries: list[dict[str, Any]]) -> list[Resource]:
    """Apply journal entries (upsert/delete by id, idempotent) to a list of resources."""
    order = [r.id for r in resources]
    table = {r.id: r for r in resources}
    for entry in entries:
        op = entry.get("op")
        if op == "upsert":
            resource = Resource.model_validate(entry["resource"])
            if resource.id not in table:
                order.append(resource.id)
            table[resource.id] = resource
        elif op == "delete":
            table.pop(str(entry.get("id")), None)
    return [table[rid] for rid in order if rid in table]


class ReleaseStore:
    """Releases of stacks on top of any :class:`RecordStore`."""

    def __init__(self, store: RecordStore, owner: str = "stackflow") -> None:
        self.store = store
        self.owner = owner

    @staticmethod
    def namespace(project: str, workspace: str) -> str:
        return f"{project}/{workspace}"

    # ---- reads ----------------------------------------------------------------------------

    def get(self, project: str, workspace: str, revision: int) -> Release:
        """The release with its journal folded into ``state``."""
        ns = self.namespace(project, workspace)
        record = self.store.get(RELEASE_TYPE, ns, str(revision))
        release = Release.model_validate(record.spec)
        entries = self.store.read_journal(RELEASE_TYPE, ns, str(revision))
        if entries:
            release.state = State(resources=fold_journal(release.state.resources, entries))
        return release

    def revisions(self, project: str, workspace: str) -> builtins.list[int]:
        ids = self.store.ids(RELEASE_TYPE, self.namespace(project, workspace))
        return [int(i) for i in ids if i.isdigit()]

    def list(self, project: str, workspace: str) -> builtins.list[Release]:
        return [self.get(project, workspace, rev) for rev in self.revisions(project, workspace)]

    def latest(self, project: str, workspace: str) -> Release | None:
        revisions = self.revisions(project, workspace)
        return self.get(project, workspace, revisions[-1]) if revisions else None

    def phase_of(self, project: str, workspace: str, revision: int) -> Phase:
        """The phase from the record's metadata only (cheap)."""
        meta = self.store.get_metadata(
            RELEASE_TYPE, self.namespace(project, workspace), str(revision)
        )
        return Phase(meta.labels["phase"])

    def latest_succeeded_revision(self, project: str, workspace: str) -> int | None:
        """Revision of the latest succeeded release, reading only metadata."""
        for rev in reversed(self.revisions(project, workspace)):
            try:
                if self.phase_of(project, workspace, rev) is Phase.succeeded:
                    return rev
            except NotFoundError:
                continue
        return None

    def latest_succeeded(self, project: str, workspace: str) -> Release | None:
        rev = self.latest_succeeded_revision(project, workspace)
        return None if rev is None else self.get(project, workspace, rev)

    def resource_state(
        self, project: str, workspace: str, revision: int, resource_id: str
    ) -> Resource | None:
        """One resource's latest state in a release: the journal's last word, else the file."""
        ns = self.namespace(project, workspace)
        for entry in reversed(self.store.read_journal(RELEASE_TYPE, ns, str(revision))):
            if entry.get("op") == "upsert" and entry["resource"].get("id") == resource_id:
                return Resource.model_validate(entry["resource"])
            if entry.get("op") == "delete" and entry.get("id") == resource_id:
                return None
        record = self.store.get(RELEASE_TYPE, ns, str(revision))
        for raw in record.spec.get("state", {}).get("resources") or []:
            if raw.get("id") == resource_id:
                return Resource.model_validate(raw)
        return None

    # ---- writes ---------------------------------------------------------------------------

    def create(
        self,
        project: str,
        workspace: str,
        operation: Operation,
        spec: Spec | None,
        *,
        workflow_id: str | None = None,
        run_id: str | None = None,
    ) -> Release:
        """Open the next revision; StackLockedError while the latest one is not final.

        The new state starts as a copy of the latest release's state, whatever its phase.
        Two writers never get the same revision: the record create is exclusive and a loser
        re-reads (and then usually finds the stack locked by the winner).
        """
        ns = self.namespace(project, workspace)
        for _ in range(_CREATE_ATTEMPTS):
            latest = self.latest(project, workspace)
            if latest is not None and not latest.phase.is_final:
                raise StackLockedError(
                    f"stack {ns} is locked: release {latest.revision} ({latest.operation}) is "
                    f"{latest.phase}; if no operation is running, unlock it with: "
                    f"stackflow release unlock --project {project} --workspace {workspace}"
                )
            stamp = now()
            release = Release(
                project=project,
                workspace=workspace,
                revision=(latest.revision + 1) if latest else 1,
                operation=operation,
                phase=Phase.generating,
                spec=spec,
                state=latest.state.model_copy(deep=True) if latest else State(),
                workflow_id=workflow_id,
                run_id=run_id,
                created_at=stamp,
                modified_at=stamp,
            )
            try:
                self.store.create(self._record(release))
            except ConflictError:
                continue  # someone else took this revision: look again
            return release
        raise ConflictError(f"stack {ns}: could not allocate a revision, too much contention")

    def import_release(self, release: Release) -> Release:
        """Store a release as it is (its revision, phase and times); ConflictError if taken."""
        self.store.create(self._record(release))
        return release

    def set_phase(
        self,
        project: str,
        workspace: str,
        revision: int,
        phase: Phase,
        *,
        error: str | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
    ) -> Release:
        """Move a release to ``phase`` (and set error/changes/approval when given).

        A final phase folds the journal into the stored state and removes the journal.
        Setting the final phase a release already has is a no-op; leaving it is refused.
        """
        ns = self.namespace(project, workspace)
        while True:
            record = self.store.get(RELEASE_TYPE, ns, str(revision))
            release = Release.model_validate(record.spec)
            if release.phase.is_final:
                if release.phase is phase:
                    self.store.clear_journal(RELEASE_TYPE, ns, str(revision))
                    return self.get(project, workspace, revision)
                raise PhaseConflictError(
                    f"release {revision} of {ns} is {release.phase} and cannot become {phase}"
                )
            entries = self.store.read_journal(RELEASE_TYPE, ns, str(revision))
            if phase.is_final and entries:
                release.state = State(resources=fold_journal(release.state.resources, entries))
            release.phase = phase
            release.modified_at = now()
            if error is not None:
                release.error = error
            if changes is not None:
                release.changes = changes
            if approval is not None:
                release.approval = approval
            new = self._record(release, version=record.metadata.version)
            try:
                self.store.update(new)
            except (OwnerConflictError, PhaseConflictError):
                raise
            except ConflictError:
                continue  # raced with another writer: redo on the fresh record
            if phase.is_final:
                self.store.clear_journal(RELEASE_TYPE, ns, str(revision))
                return release
            return self.get(project, workspace, revision)

    def record_resource(
        self, project: str, workspace: str, revision: int, resource: Resource
    ) -> None:
        """Journal one applied resource (its state with live attributes); idempotent."""
        self.store.append_journal(
            RELEASE_TYPE,
            self.namespace(project, workspace),
            str(revision),
            {"op": "upsert", "resource": resource.model_dump(mode="json", by_alias=True)},
        )

    def record_deletion(
        self, project: str, workspace: str, revision: int, resource_id: str
    ) -> None:
        """Journal one deleted resource; idempotent."""
        self.store.append_journal(
            RELEASE_TYPE,
            self.namespace(project, workspace),
            str(revision),
            {"op": "delete", "id": resource_id},
        )

    def unlock(self, project: str, workspace: str) -> Release:
        """Mark the latest release failed if it is in progress; return it."""
        latest = self.latest(project, workspace)
        if latest is None:
            raise NotFoundError(f"stack {self.namespace(project, workspace)} has no releases")
        if latest.phase.is_final:
            return latest
        return self.set_phase(
            project,
            workspace,
            latest.revision,
            Phase.failed,
            error=f"unlocked by hand while {latest.phase}; the operation may not have finished",
        )

    def _record(self, release: Release, version: int = 0) -> Record:
        return Record(
            metadata=Metadata(
                namespace=self.namespace(release.project, release.workspace),
                type=RELEASE_TYPE,
                id=str(release.revision),
                version=version,
                owner=self.owner,
                labels={"phase": release.phase.value, "operation": release.operation.value},
            ),
            spec=release.model_dump(mode="json", by_alias=True),
        )
