"""The activities: all I/O of the operation workflows.

By phase, around shared parts that each activity class receives:

- :mod:`.deps` — ``Deps``: the worker's clients (runtime registry, state backend, spec and
  plan stores, Redis cache, Temporal run oracle);
- :mod:`.stack_guard` — ``StackGuard``: the stack lock (open a release, recover a stale
  lock, fenced writes);
- :mod:`.resource_step` — ``ResourceStep``: what happens to one resource (request,
  references, taint, policy pre-check, runtime call, what is recorded sensitive);
- :mod:`.prepare` (``prepare_operation``), :mod:`.preview` (``preview_batch``,
  ``describe_changes``, ``index_diffs``), :mod:`.policy` (``evaluate_policy``),
  :mod:`.walk` (``apply_resource``, ``delete_resource``, ``run_group``, ``load_batch``,
  ``set_phase``, ``append_events``) and :mod:`.observe` (``refresh_batch``,
  ``record_drift``);
- :mod:`.errors` (one classification of failures), :mod:`.heartbeat`, :mod:`.runs`.

Workflows call them by method reference (``WalkActivities.apply_resource``); each keeps the
name it is registered under in history (``@activity.defn(name=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stackflow.activities.deps import Deps
from stackflow.activities.notify import NotifyActivities
from stackflow.activities.observe import ObserveActivities
from stackflow.activities.policy import PolicyActivities
from stackflow.activities.prepare import PrepareActivities
from stackflow.activities.preview import PreviewActivities
from stackflow.activities.resource_step import ResourceStep
from stackflow.activities.runs import RunOracle
from stackflow.activities.stack_guard import StackGuard
from stackflow.activities.stack_set import SetActivities
from stackflow.activities.walk import WalkActivities
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.state.event_bell import Bell


@dataclass
class WorkerActivities:
    """Every activity class of one worker, sharing one :class:`Deps`."""

    deps: Deps
    backend: StateBackend
    """The whole backend the activities' state is (the worker names it and closes it)."""
    prepare: PrepareActivities
    preview: PreviewActivities
    walk: WalkActivities
    observe: ObserveActivities
    notify: NotifyActivities
    policy: PolicyActivities
    sets: SetActivities

    @classmethod
    def create(
        cls,
        registry: RuntimeRegistry,
        backend: StateBackend,
        cache: PriorStateCache,
        oracle: RunOracle | None = None,
        bell: Bell | None = None,
    ) -> WorkerActivities:
        deps = Deps.create(registry, backend, cache, oracle, bell)
        guard = StackGuard(deps)
        step = ResourceStep(deps)
        return cls(
            deps=deps,
            backend=backend,
            prepare=PrepareActivities(deps, guard),
            preview=PreviewActivities(deps, step),
            walk=WalkActivities(deps, guard, step),
            observe=ObserveActivities(deps, guard, step),
            notify=NotifyActivities(deps),
            policy=PolicyActivities(deps),
            sets=SetActivities(deps),
        )

    @property
    def registry(self) -> RuntimeRegistry:
        return self.deps.registry

    def runtime_calls(self) -> list[Callable[..., Any]]:
        """The activities that call a runtime: what a runtime's own task queue carries."""
        return [
            self.preview.preview_batch,
            self.observe.refresh_batch,
            self.walk.apply_resource,
            self.walk.delete_resource,
            self.walk.run_group,
        ]

    def all(self) -> list[Callable[..., Any]]:
        """The bound activity methods a worker registers."""
        return [
            self.prepare.prepare_operation,
            self.preview.preview_batch,
            self.preview.describe_changes,
            self.preview.index_diffs,
            self.policy.evaluate_policy,
            self.walk.load_batch,
            self.walk.set_phase,
            self.walk.append_events,
            self.walk.apply_resource,
            self.walk.delete_resource,
            self.walk.run_group,
            self.observe.refresh_batch,
            self.notify.notification_targets,
            self.notify.deliver_notification,
            self.notify.record_notification_failure,
            self.observe.record_drift,
            self.sets.prepare_set,
            self.sets.resolve_member,
            self.sets.forward_approval,
        ]
