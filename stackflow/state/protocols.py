"""The state backend's interface, as small protocols, one per concern (as cosi-project's
``CoreState`` and Kusion's release ``Storage``): a part of stackflow that needs one concern
takes that protocol, and a new backend can be checked protocol by protocol by the state
conformance suite (``tests/conformance/state/``). :class:`~stackflow.state.backend.StateBackend`
(SQLite and PostgreSQL) satisfies all of them.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.drift import DriftReport
from stackflow.model.events import PAGE_LIMIT, NewEvent, RunEvent
from stackflow.model.notifications import NotificationFailure, NotificationTarget
from stackflow.model.policy import PolicyBinding, PolicyDecision
from stackflow.model.release import Approval, Operation, Phase, Release
from stackflow.model.source import BoundSource, GitSource, SourceRef
from stackflow.model.spec import Resource, Spec
from stackflow.state.models import RunKey, SourcePush, StackLock

if TYPE_CHECKING:
    from stackflow.state.path_claims import PathOwner


@runtime_checkable
class SchemaAdmin(Protocol):
    """The schema's lifecycle: the newest migration, the current one, migrating to it,
    refusing to run against another, closing the engine."""

    def head_revision(self) -> str: ...
    def schema_revision(self) -> str | None: ...
    def migrate(self) -> str: ...
    def check_schema(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed blobs (specs, plans, diffs, reports): stored once under their
    sha256, the hash checked on every read, sealed at rest when keys are configured."""

    def put_blob(self, kind: str, body: bytes) -> str: ...
    def get_blob(self, kind: str, ref: str) -> bytes: ...
    def put_spec(self, spec: Spec) -> str: ...
    def get_spec(self, ref: str) -> Spec: ...


@runtime_checkable
class ReleaseReader(Protocol):
    """Releases (revision 1, 2, 3... per stack) and the state of each
    resource per release, as recorded."""

    def get(
        self,
        stack: StackRef,
        revision: int,
        *,
        with_spec: bool = True,
        with_state: bool = True,
    ) -> Release: ...
    def revisions(self, stack: StackRef) -> builtins.list[int]: ...
    def list(self, stack: StackRef, *, with_state: bool = False) -> builtins.list[Release]: ...
    def stacks(self) -> builtins.list[StackRef]: ...
    def latest(self, stack: StackRef, *, with_spec: bool = True) -> Release | None: ...
    def phase_of(self, stack: StackRef, revision: int) -> Phase: ...
    def latest_succeeded_revision(self, stack: StackRef) -> int | None: ...
    def latest_succeeded(self, stack: StackRef) -> Release | None: ...
    def latest_spec_ref(self, stack: StackRef) -> str | None: ...
    def resources(
        self, stack: StackRef, revision: int, ids: Iterable[str] | None = None
    ) -> dict[str, Resource]: ...
    def resource_state(
        self, stack: StackRef, revision: int, resource_id: str
    ) -> Resource | None: ...
    def resource_ids(self, stack: StackRef, revision: int) -> builtins.list[str]: ...
    def sealed_resources(self, stack: StackRef, revision: int) -> dict[str, str]: ...


@runtime_checkable
class StackLocks(Protocol):
    """The stack lock, owned by a run. ``create`` opens the next release and takes the lock
    for ``run`` (refused while another release of the stack is not final); ``assert_holds``
    checks that ``run`` still holds it; ``recover`` closes the release of a holder that has
    ended, ``transfer`` hands the lock to the new run of a reset, ``unlock`` frees it by
    hand. Every write of :class:`ReleaseWriter` and :class:`TerraformStateStore` is a
    compare-and-set on the holding run in its own transaction: any other run's write raises
    ``FencedError`` and writes nothing."""

    def lock(self, stack: StackRef) -> StackLock | None: ...
    def create(
        self,
        stack: StackRef,
        operation: Operation,
        spec: Spec | None = None,
        *,
        spec_ref: str | None = None,
        run: RunRef | None = None,
        source_revision: int | None = None,
        source: SourceRef | None = None,
        set_run: str | None = None,
    ) -> Release: ...
    def assert_holds(self, stack: StackRef, revision: int, run: RunRef | None) -> None: ...
    def recover(self, holder: StackLock, reason: str) -> bool: ...
    def transfer(self, holder: StackLock, run: RunRef) -> bool: ...
    def unlock(self, stack: StackRef, reason: str | None = None) -> Release: ...


@runtime_checkable
class ReleaseWriter(Protocol):
    """Fenced writes to the open release: its phase (a final phase frees the lock), each
    resource's state as its node finishes, deletions; and importing a finished release
    (Kusion)."""

    def set_phase(
        self,
        stack: StackRef,
        revision: int,
        phase: Phase,
        *,
        run: RunRef | None = None,
        error: str | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
        policy: PolicyDecision | None = None,
    ) -> Release: ...
    def record_resource(
        self,
        stack: StackRef,
        revision: int,
        resource: Resource,
        *,
        run: RunRef | None = None,
    ) -> None: ...
    def record_resources(
        self,
        stack: StackRef,
        revision: int,
        resources: Iterable[Resource],
        *,
        run: RunRef | None = None,
    ) -> None: ...
    def record_deletion(
        self,
        stack: StackRef,
        revision: int,
        resource_id: str,
        *,
        run: RunRef | None = None,
    ) -> None: ...
    def record_deletions(
        self,
        stack: StackRef,
        revision: int,
        resource_ids: Iterable[str],
        *,
        run: RunRef | None = None,
    ) -> None: ...
    def import_release(self, release: Release) -> Release: ...


@runtime_checkable
class DriftReportStore(Protocol):
    """Drift checks' reports per stack, newest first."""

    def put_drift_report(self, report: DriftReport) -> None: ...
    def drift_reports(self, stack: StackRef, limit: int = 1) -> builtins.list[DriftReport]: ...


@runtime_checkable
class TerraformStateStore(Protocol):
    """The latest OpenTofu state of each Terraform resource of a stack, written (fenced by
    the run) right after every apply or destroy, so a fresh working directory on any worker
    starts from it; the newest serial wins. Beside them, the plan files an apply's preview
    saved for the release being applied, each taken once by that release's apply."""

    def put_terraform_state(
        self,
        stack: StackRef,
        resource_id: str,
        body: str,
        *,
        revision: int,
        run: RunRef | None,
    ) -> None: ...
    def put_terraform_states(
        self,
        stack: StackRef,
        bodies: Mapping[str, str],
        *,
        revision: int,
        run: RunRef | None,
    ) -> None: ...
    def get_terraform_state(self, stack: StackRef, resource_id: str) -> str | None: ...
    def get_terraform_states(
        self, stack: StackRef, resource_ids: Iterable[str]
    ) -> dict[str, str]: ...
    def delete_terraform_state(
        self, stack: StackRef, resource_id: str, *, revision: int, run: RunRef | None
    ) -> None: ...
    def put_terraform_plan(
        self, stack: StackRef, revision: int, digest: str, plan: bytes
    ) -> None: ...
    def take_terraform_plan(self, stack: StackRef, revision: int, digest: str) -> bytes | None: ...


@runtime_checkable
class RunEventLog(Protocol):
    """Each run's event stream (:mod:`stackflow.model.events`): appends numbered from 1 with no
    gap and committed in order, idempotent by key; reads after a ``seq``, only through the
    run's stack."""

    def append_events(
        self, stack: StackRef, run: RunRef, events: Sequence[NewEvent]
    ) -> builtins.list[RunEvent]: ...
    def events(
        self, stack: StackRef, run_id: str, *, after: int = 0, limit: int = PAGE_LIMIT
    ) -> builtins.list[RunEvent]: ...
    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None: ...


@runtime_checkable
class SourceBindings(Protocol):
    """Stacks bound to git sources (one binding per stack; the webhook secret sealed)."""

    def bind_source(self, stack: StackRef, source: GitSource, *, by: str | None = None) -> None: ...
    def unbind_source(self, stack: StackRef) -> bool: ...
    def source_of(self, stack: StackRef) -> BoundSource | None: ...
    def sources_of_repository(self, url: str) -> builtins.list[tuple[StackRef, BoundSource]]: ...
    def last_push(self, stack: StackRef) -> SourcePush | None: ...
    def record_push(self, stack: StackRef, url: str, commit: str) -> None: ...


@runtime_checkable
class PolicyBindings(Protocol):
    """A project's policy bundle (the digest of a blob; one per project, replaced by a
    push)."""

    def bind_policy(self, project: str, digest: str, *, by: str | None = None) -> None: ...
    def unbind_policy(self, project: str) -> bool: ...
    def policy_of(self, project: str) -> PolicyBinding | None: ...


@runtime_checkable
class NotificationStore(Protocol):
    """A project's webhook destinations (secrets sealed; set as a whole or one by one, in
    order) and the deliveries that failed for good, newest first."""

    def set_notification_targets(
        self, project: str, targets: builtins.list[NotificationTarget]
    ) -> None: ...
    def notification_targets(self, project: str) -> builtins.list[NotificationTarget]: ...
    def put_notification_target(self, project: str, target: NotificationTarget) -> bool: ...
    def remove_notification_target(self, project: str, name: str) -> bool: ...
    def record_notification_failure(self, failure: NotificationFailure) -> None: ...
    def notification_failures(
        self, project: str, limit: int = 100
    ) -> builtins.list[NotificationFailure]: ...


@runtime_checkable
class RunKeys(Protocol):
    """The API's ``Idempotency-Key`` claims: one per stack and key, the request it was made
    for and the run its start made."""

    def claim_run_key(
        self, stack: StackRef, key: str, digest: str, *, window: timedelta
    ) -> RunKey | None: ...
    def record_run_key(self, stack: StackRef, key: str, workflow_id: str, run_id: str) -> None: ...
    def drop_run_key(self, stack: StackRef, key: str) -> None: ...


@runtime_checkable
class PathClaims(Protocol):
    """Which stack owns each OnPrem path (:mod:`stackflow.state.path_claims`): claimed
    before a path is written (one stack wins a path, even when two claim it at once),
    released once it is deleted; a claim whose owner no longer records it is stale."""

    def path_owners(self, stack: StackRef, paths: Iterable[str]) -> dict[str, PathOwner]: ...
    def claim_paths(
        self,
        stack: StackRef,
        claims: Mapping[str, str],
        *,
        revision: int | None,
        run: RunRef | None,
    ) -> dict[str, PathOwner]: ...
    def release_paths(
        self,
        stack: StackRef,
        paths: Iterable[str],
        *,
        revision: int | None,
        run: RunRef | None,
    ) -> None: ...


STATE_PROTOCOLS: tuple[type, ...] = (
    SchemaAdmin,
    BlobStore,
    ReleaseReader,
    StackLocks,
    ReleaseWriter,
    DriftReportStore,
    TerraformStateStore,
    RunEventLog,
    SourceBindings,
    NotificationStore,
    PolicyBindings,
    RunKeys,
    PathClaims,
)
"""Every protocol a complete state backend satisfies."""
