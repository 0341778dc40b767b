"""What every activity class receives: the worker's shared clients, in one dataclass.

Built once per worker (:meth:`Deps.create`); the activity classes (prepare, preview, walk,
observe) and their shared parts (:class:`~stackflow.activities.stack_guard.StackGuard`,
:class:`~stackflow.activities.resource_step.ResourceStep`) take it in their constructor, so a
test can hand them a fake of any part.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackflow.activities.runs import RunOracle, TemporalRunOracle
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.state.event_bell import Bell, RingingEventLog
from stackflow.state.plan_store import PlanStore
from stackflow.state.protocols import RunEventLog
from stackflow.state.spec_store import SpecStore


@dataclass
class Deps:
    registry: RuntimeRegistry
    """Resource type -> runtime: the only code that touches infrastructure."""
    backend: StateBackend
    """The system of record: releases, resource state, the lock, blobs."""
    specs: SpecStore
    """Specs by content ref, in the backend."""
    plans: PlanStore
    """Walk plans by content ref, in the backend."""
    cache: PriorStateCache
    """Redis read-through cache of the latest succeeded state (never the truth)."""
    oracle: RunOracle
    """Temporal's answer to "has the run holding this stack ended?"."""
    events: RunEventLog
    """Where activities append a run's events: the backend's log, ringing the run's bell
    after each append when Redis is configured (:mod:`stackflow.state.event_bell`)."""

    @classmethod
    def create(
        cls,
        registry: RuntimeRegistry,
        backend: StateBackend,
        cache: PriorStateCache,
        oracle: RunOracle | None = None,
        bell: Bell | None = None,
    ) -> Deps:
        return cls(
            registry=registry,
            backend=backend,
            specs=SpecStore(backend),
            plans=PlanStore(backend),
            cache=cache,
            oracle=oracle or TemporalRunOracle(),
            events=RingingEventLog(backend, bell) if bell is not None else backend,
        )
