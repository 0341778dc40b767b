"""The runtime interface: the only code that touches infrastructure implements it.

A runtime turns a resource's desired attributes into a live object and back. The engine
never knows how; it only calls these five methods and reacts to the typed errors below
(which activities map onto Temporal's retry semantics).
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from stackflow.core.refs import RunRef, StackFields

Attributes = dict[str, Any]


class RuntimeFailure(Exception):
    """Base of runtime failures; ``retryable`` tells the executor whether to try again."""

    retryable: ClassVar[bool] = False
    kind: ClassVar[str] = "RuntimeError"

    def __init__(self, message: str, *, resource_id: str | None = None) -> None:
        super().__init__(message)
        self.resource_id = resource_id


class NotFound(RuntimeFailure):
    """The object does not exist (``read`` returns None instead of raising it)."""

    kind = "NotFound"


class InvalidInput(RuntimeFailure):
    """The desired attributes can never succeed as written: fix the spec."""

    kind = "InvalidInput"


class Denied(RuntimeFailure):
    """A policy of the infrastructure itself refused the object (a Kubernetes admission
    policy or webhook): a policy denial like the policy gate's (error type ``PolicyDenied``,
    exit 2); fix the spec, or the policy, retrying will not help. The message names the
    policy and never quotes a sensitive value."""

    kind = "PolicyDenied"


class Conflict(RuntimeFailure):
    """Someone else owns or manages the object; retrying will not help."""

    kind = "Conflict"


class OwnedElsewhere(Conflict):
    """Another stack owns the object (a Kubernetes object's ownership annotations, an
    OnPrem path's claim): held, like a stack another run holds (exit 3); remove it from that
    stack first."""

    kind = "OwnedElsewhere"


class Unavailable(RuntimeFailure):
    """The infrastructure cannot be reached right now; retrying may help."""

    retryable = True
    kind = "Unavailable"


class RuntimeOptions(StackFields, BaseModel):
    """Per-run options passed to every runtime call."""

    model_config = ConfigDict(frozen=True)

    project: str
    workspace: str
    force: bool = False
    adopt: bool = False
    timeout_seconds: float = Field(default=300.0, gt=0)
    context: Mapping[str, Any] = Field(default_factory=dict)
    revision: int | None = None
    """The release being applied (None for previews): state writes name it."""
    owner: RunRef | None = None
    """The run that holds the stack: a runtime's own state writes are fenced by it."""
    preview_of: int | None = None
    """The release whose apply follows this preview (an apply's preview; None otherwise): a
    runtime may keep what it planned for that apply (Terraform keeps its plan files)."""


class ResourceRequest(BaseModel):
    """What a runtime is asked to act on: one resource of the spec, references resolved."""

    id: str
    type: str
    attributes: Attributes = Field(default_factory=dict)
    extensions: Attributes = Field(default_factory=dict)
    prior_state: Attributes | None = None
    """The attributes the last release recorded (e.g. Terraform state kept by stackflow)."""
    sensitive_paths: list[str] = Field(default_factory=list)
    """Paths of ``attributes`` holding a value taken from a sensitive one (taint through
    ``$kusion_path``): a runtime that can keep values secret itself does (Terraform hands
    them to OpenTofu as sensitive variables)."""


class PreviewResult(BaseModel):
    """What the object would become, plus paths whose values must never be shown.

    ``would_be`` holds the fields the spec sets; ``removed_paths`` names fields outside them
    that the apply would remove from the live object (a runtime whose apply merges, as
    server-side apply does, removes what its manager set before and the spec no longer
    does)."""

    would_be: Attributes
    sensitive_paths: list[str] = Field(default_factory=list)
    replace: bool = False
    removed_paths: list[str] = Field(default_factory=list)


class ReadScope:
    """The reads of one preview batch: which objects it will read (so a runtime can answer
    many reads of one kind and place from one listing) and the run they belong to (a
    listing may serve the run's later preview batches on this worker, as one snapshot).
    In a walk (``lists`` False) nothing is listed; a runtime may still look up what the
    run's preview listed, to act on exactly that object or read it afresh.

    The scope knows nothing of any runtime's objects: a runtime counts the batch's
    attributes by a key of its own (:meth:`count`, e.g. Kubernetes' apiVersion, kind and
    namespace)."""

    def __init__(
        self,
        run: str,
        attributes: Iterable[Mapping[str, Any]],
        *,
        lists: bool = True,
        run_size: int = 0,
        span: int = 0,
        deleting: Iterable[str] = (),
    ) -> None:
        self.run = run
        self.lists = lists
        self.deleting = frozenset(deleting)
        """Ids of the batch's resources the run deletes (their reads preview the deletion)."""
        self._attributes = list(attributes)
        self.span = max(span, len(self._attributes))
        """How many of the run's resources this batch's slice of the plan covers (with
        runtime queues, other runtimes' too: their batches read them)."""
        self.run_size = max(run_size, self.span)
        """How many resources the run's preview reads in all its batches."""
        self._tallies: dict[Callable[[Mapping[str, Any]], Hashable], Counter[Hashable]] = {}

    def count(self, key: Callable[[Mapping[str, Any]], Hashable], value: Hashable) -> int:
        """How many of the batch's objects ``key`` maps to ``value`` (one tally per key)."""
        tally = self._tallies.get(key)
        if tally is None:
            tally = Counter(key(attrs) for attrs in self._attributes)
            self._tallies[key] = tally
        return tally[value]

    def run_count(self, key: Callable[[Mapping[str, Any]], Hashable], value: Hashable) -> int:
        """How many objects ``key`` maps to ``value`` the whole run is expected to read: the
        batch's count scaled from its slice of the plan to the run's size (the run's batches
        are cut from one plan)."""
        count = self.count(key, value)
        return max(count, count * self.run_size // self.span) if self.span else count


READ_SCOPE: contextvars.ContextVar[ReadScope | None] = contextvars.ContextVar(
    "stackflow_read_scope", default=None
)


@contextlib.contextmanager
def read_scope(
    run: str,
    attributes: Iterable[Mapping[str, Any]] = (),
    *,
    lists: bool = True,
    run_size: int = 0,
    span: int = 0,
    deleting: Iterable[str] = (),
) -> Iterator[ReadScope]:
    """Reads made inside (by tasks started inside) belong to one preview batch of ``run``
    (``lists`` False: to a walk of it), a slice of ``span`` of the ``run_size`` resources
    the run's preview reads in all."""
    scope = ReadScope(run, attributes, lists=lists, run_size=run_size, span=span, deleting=deleting)
    token = READ_SCOPE.set(scope)
    try:
        yield scope
    finally:
        READ_SCOPE.reset(token)


class Runtime(abc.ABC):
    """Async interface every infrastructure implements."""

    type_name: ClassVar[str]
    checks_every_call: ClassVar[bool] = False
    """True when read/preview/apply/delete each run ``check_policy`` themselves on the very
    path or object they touch; callers then skip their own check right before the call
    (the whole-spec check at preview still runs first)."""
    coalesces_calls: ClassVar[bool] = False
    """True when concurrent calls are merged into one command (Terraform): callers should
    make them all at once rather than a few at a time."""

    @abc.abstractmethod
    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        """Return the live object, or None when it does not exist."""

    def check_policy(  # noqa: B027 - optional hook
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> None:
        """Refuse (:class:`stackflow.runtimes.policy.PolicyViolation`) what the worker policy
        forbids.

        Called before any other call (and by the runtime itself on every call); it may look at
        local files the policy needs (paths, a kubeconfig) but never at infrastructure.
        Blocking: callers run it in a thread. Default: nothing to check.
        """

    def check_policies(self, resources: Sequence[ResourceRequest], options: RuntimeOptions) -> None:
        """:meth:`check_policy` for each resource in order (the first refusal is raised); a
        runtime may share work between them (OnPrem resolves each directory once)."""
        for resource in resources:
            self.check_policy(resource, options)

    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        """Return what the object would become if applied; defaults to the desired attributes."""
        return PreviewResult(would_be=dict(resource.attributes))

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """The live object and (``with_preview``) what it would become: what a preview needs.
        Default: :meth:`read`, then :meth:`preview`; a runtime whose preview reads the object
        anyway answers both from one look."""
        live = await self.read(resource, options)
        return live, (await self.preview(resource, options) if with_preview else None)

    @abc.abstractmethod
    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        """Make the object match the desired attributes; return its live state. Idempotent."""

    @abc.abstractmethod
    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        """Delete the object and wait until it is gone; deleting a missing object succeeds."""

    async def wait_ready(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        """Wait until the object is ready (rolled out, bound, ...); default: already ready."""
        live = await self.read(resource, options)
        if live is None:
            raise NotFound(f"{resource.id} does not exist", resource_id=resource.id)
        return live

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and connections."""
