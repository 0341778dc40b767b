"""Maps a resource ``type`` to the runtime that manages it.

A new infrastructure plugs in by declaring its :class:`~stackflow.model.runtime_rules.RuntimeRules`
in the entry-point group ``stackflow.runtimes`` (see the README, "Adding a runtime"), or,
in-process, through ``register``, without touching the engine. The rules name the runtime's
class (``RuntimeRules.runtime``); this module imports and builds it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from stackflow.model.runtime_rules import RuntimeLoadError, RuntimeRules, all_rules, resolve
from stackflow.runtimes.base import InvalidInput, Runtime

if TYPE_CHECKING:
    from stackflow.state.backend import StateBackend

RuntimeFactory = Callable[[], Runtime]


def build(rules: RuntimeRules, backend: StateBackend | None) -> Runtime:
    """The runtime ``rules`` names, built (with the state backend under the keyword its
    rules name, when they name one)."""
    cls = resolve(rules.runtime, f"the runtime of type {rules.type_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise RuntimeLoadError(
            f"the runtime of type {rules.type_name!r} ({rules.runtime}) is not a Runtime class"
        )
    if rules.backend_argument is None:
        return cls()
    return cls(**{rules.backend_argument: backend})


class RuntimeRegistry:
    """Lazily builds one runtime instance per type and hands it out."""

    def __init__(self, only: frozenset[str] | None = None) -> None:
        self._factories: dict[str, RuntimeFactory] = {}
        self._instances: dict[str, Runtime] = {}
        self.only = only
        """The types a worker for some runtimes serves (None: every type it knows)."""

    def serves(self, type_name: str) -> bool:
        """Whether resources of ``type_name`` are this worker's to check and touch: a worker
        for some runtimes leaves the other types to their own workers."""
        return self.only is None or type_name in self.only

    def register(self, type_name: str, factory: RuntimeFactory) -> None:
        self._factories[type_name] = factory
        self._instances.pop(type_name, None)

    def types(self) -> list[str]:
        return sorted(self._factories)

    def get(self, type_name: str) -> Runtime:
        if type_name not in self._instances:
            factory = self._factories.get(type_name)
            if factory is None:
                known = ", ".join(self.types()) or "none"
                raise InvalidInput(f"no runtime for resource type {type_name!r} (known: {known})")
            self._instances[type_name] = factory()
        return self._instances[type_name]

    def find(self, type_name: str) -> Runtime | None:
        """The runtime for the type, or None (no error) when there is none."""
        return self.get(type_name) if type_name in self._factories else None

    async def close(self) -> None:
        for runtime in self._instances.values():
            await runtime.close()
        self._instances.clear()


def default_registry(
    backend: StateBackend | None = None, only: frozenset[str] | None = None
) -> RuntimeRegistry:
    """Every installed runtime (or ``only`` those types: a worker for some runtimes):
    stackflow's own and any other distribution's, found through the entry-point group
    ``stackflow.runtimes`` (:mod:`stackflow.model.runtime_rules`) and built lazily, so a missing
    client costs nothing. ``backend`` is handed to each runtime whose rules name a
    ``backend_argument`` (the Terraform runtime keeps its state there, readable from any
    host)."""
    registry = RuntimeRegistry(only)
    for type_name, rules in all_rules().items():
        if only is None or type_name in only:
            registry.register(type_name, functools.partial(build, rules, backend))
    return registry
