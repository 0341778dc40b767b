"""What the engine asks a runtime without building it: its rules, found through entry points.

Every runtime ships one :class:`RuntimeRules` object and names it in the entry-point group
``stackflow.runtimes`` of its distribution (stackflow's own three runtimes are declared in
its ``pyproject.toml`` the same way)::

    [project.entry-points."stackflow.runtimes"]
    mycloud = "mycloud_runtime.rules:RULES"

The rules say which ``type`` a resource names to reach the runtime, what a valid id of that
type looks like, which of its attributes are secret, whether its nodes may share an activity,
which edges its resources imply,
and how to build the runtime itself (:meth:`RuntimeRules.create`, called by
:mod:`runtimes.registry`). The rules module must be cheap to import (no client libraries):
spec validation and masking load it in the CLI. Policy checks belong to the runtime
(:meth:`runtimes.base.Runtime.check_policy`), which reads the worker policy of
:mod:`stackflow.runtimes.policy` and keeps its own checks in its own package.

This module finds runtimes by entry point only, so ``stackflow`` imports no runtime module.
"""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from stackflow.core.errors import StackflowError

if TYPE_CHECKING:
    from stackflow.engine.graph import Described
    from stackflow.runtimes.base import Runtime
    from stackflow.state.backend import StateBackend

ENTRY_POINT_GROUP = "stackflow.runtimes"


class RuntimeLoadError(StackflowError):
    """An entry point of ``stackflow.runtimes`` does not load or is not a RuntimeRules."""


class RuntimeRules:
    """The rules one runtime declares. Subclass it, set :attr:`type_name`, override what
    differs from the defaults, and expose one instance through the entry-point group."""

    type_name: ClassVar[str]
    """The ``type`` of the resources this runtime manages (``Kubernetes``)."""
    grouped: ClassVar[bool] = False
    """Whether the runtime's nodes are cheap enough to share one activity (a workflow
    decision: the walk's history shape depends on it, so the workflows keep the list of
    grouped types as a constant, checked against these declarations by the tests)."""

    def create(self, backend: StateBackend | None) -> Runtime:
        """Build the runtime (``backend``: where a runtime that keeps state of its own keeps
        it). Called once per worker and type, lazily."""
        raise NotImplementedError(f"{type(self).__name__}.create")

    def id_problem(self, resource_id: str) -> str | None:
        """Why ``resource_id`` breaks this type's id convention, or None (default: any id)."""
        return None

    def sensitive_paths(self, attributes: Mapping[str, Any]) -> list[str]:
        """Paths of ``attributes`` that hold secrets by their nature (a Kubernetes Secret's
        ``data``), never shown. Default: none (values the runtime records as sensitive are
        masked anyway, see :func:`stackflow.engine.masking.sensitive_paths_for`)."""
        return []

    def implicit_dependencies(self, resources: Sequence[Described]) -> dict[str, list[str]]:
        """Edges ``resources`` imply without saying (``{dependent id: [dependency ids]}``),
        among this runtime's resources (a spec's, or a release's recorded ones: destroy
        derives them again). Default: none."""
        return {}


_lock = threading.Lock()
_found: dict[str, RuntimeRules] | None = None


def _declared_in_checkout() -> list[EntryPoint]:
    """The group as this source checkout's ``pyproject.toml`` declares it: a virtualenv
    installed before a runtime was declared there still finds it (`make setup` brings the
    installed metadata up to date). Empty for an installed wheel."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    if data.get("project", {}).get("name") != "stackflow":
        return []
    group = data["project"].get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return [EntryPoint(name, str(value), ENTRY_POINT_GROUP) for name, value in group.items()]


def _discover() -> dict[str, RuntimeRules]:
    found: dict[str, RuntimeRules] = {}
    points = {point.name: point for point in _declared_in_checkout()}
    points.update((point.name, point) for point in entry_points(group=ENTRY_POINT_GROUP))
    for point in sorted(points.values(), key=lambda p: p.name):
        try:
            rules = point.load()
        except Exception as exc:  # a broken plug-in names itself, not a traceback
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} ({point.value}) does not load: {exc}"
            ) from exc
        if isinstance(rules, type) and issubclass(rules, RuntimeRules):
            rules = rules()
        if not isinstance(rules, RuntimeRules):
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} ({point.value}) is not a RuntimeRules"
            )
        other = found.get(rules.type_name)
        if other is not None and type(other) is not type(rules):
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} declares type {rules.type_name!r}, "
                f"which {type(other).__module__} declares already"
            )
        found[rules.type_name] = rules
    return found


def all_rules() -> Mapping[str, RuntimeRules]:
    """Every installed runtime's rules, by resource type (loaded once per process)."""
    global _found
    with _lock:
        if _found is None:
            _found = _discover()
        return _found


def rules_for(type_name: str) -> RuntimeRules | None:
    """The rules of the runtime for ``type_name``, or None when no runtime declares it."""
    return all_rules().get(type_name)


def known_types() -> list[str]:
    return sorted(all_rules())


def reload_runtimes() -> None:
    """Forget what was found: the next question scans the entry points again (for tests
    and tools that install a runtime into a running process)."""
    global _found
    with _lock:
        _found = None
