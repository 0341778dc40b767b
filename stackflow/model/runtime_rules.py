"""What the engine asks a runtime without building it: its rules, found through entry points.

Every runtime ships one :class:`RuntimeRules` object and names it in the entry-point group
``stackflow.runtimes`` of its distribution (stackflow's own three runtimes are declared in
its ``pyproject.toml`` the same way)::

    [project.entry-points."stackflow.runtimes"]
    mycloud = "mycloud_runtime.rules:RULES"

The rules say which ``type`` a resource names to reach the runtime, what a valid id of that
type looks like, which of its attributes are secret, which edges its resources imply, which
attributes list the ids of resources they read, and, as data, where the runtime and its
worker-policy section are (class paths ``"package.module:Class"`` that
:mod:`stackflow.runtimes.registry` and :mod:`stackflow.runtimes.policy` import on a worker),
its task queue's name and how its nodes are grouped in a walk. The rules module must be
cheap to import (no client libraries, not its own runtime): spec validation and masking
load it in the CLI. Policy checks belong to the runtime
(:meth:`runtimes.base.Runtime.check_policy`), which reads the worker policy of
:mod:`stackflow.runtimes.policy` and keeps its own checks in its own package.

This module finds runtimes by entry point only, so ``stackflow`` imports no runtime module,
and sits in the model layer: it imports nothing of stackflow but its errors.
"""

from __future__ import annotations

import importlib
import threading
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol

from stackflow.core.errors import StackflowError

ENTRY_POINT_GROUP = "stackflow.runtimes"


class Described(Protocol):
    """What an implicit-edge rule reads of a resource (a spec's or a recorded one)."""

    @property
    def id(self) -> str: ...

    @property
    def type(self) -> Any: ...

    @property
    def attributes(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Grouping:
    """How a walk groups a runtime's ready nodes into one ``run_group`` activity: at most
    ``limit`` nodes, and with ``rounds`` at most that many per call of the group's share of
    the run's concurrency (None for both: about GROUP_ROUNDS rounds of its share, GROUP_LIMIT
    at most, as :mod:`stackflow.workflows.walker` sizes groups by default)."""

    limit: int | None = None
    rounds: int | None = None


class RuntimeLoadError(StackflowError):
    """An entry point of ``stackflow.runtimes`` does not load or is not a RuntimeRules."""


class RuntimeRules:
    """The rules one runtime declares. Subclass it, set :attr:`type_name`, override what
    differs from the defaults, and expose one instance through the entry-point group."""

    type_name: ClassVar[str]
    """The ``type`` of the resources this runtime manages (``Kubernetes``)."""
    runtime: ClassVar[str]
    """Where the runtime class is, ``"package.module:Class"`` (a subclass of
    :class:`stackflow.runtimes.base.Runtime`): :mod:`stackflow.runtimes.registry` imports and
    builds it once per worker and type, lazily, so the rules never import their runtime."""
    backend_argument: ClassVar[str | None] = None
    """The keyword under which the runtime's constructor takes the worker's state backend
    (a runtime that keeps state of its own there: ``backend``, ``claims``); None: it is built
    with no argument."""
    name: ClassVar[str | None] = None
    """The runtime's name in ``stackflow worker --runtimes``, ``STACKFLOW_RUNTIME_QUEUES`` and
    its task queue's name (``<main queue>-<name>``); None: the type in lower case."""
    policy_section: ClassVar[str | None] = None
    """Where the model of the runtime's section of the worker policy file is,
    ``"package.module:Class"`` (a subclass of
    :class:`stackflow.runtimes.policy_section.PolicySection`; its ``PER_PROJECT`` settings
    may be narrowed per project), read by the runtime with ``WorkerPolicy.section``. The
    section is named :attr:`runtime_name`; None: the runtime has no section. (stackflow's
    own three name theirs too, which are also fields of
    :class:`stackflow.runtimes.policy.PolicySettings`, set by ``STACKFLOW_*`` variables.)"""
    grouped: ClassVar[bool] = False
    """Whether the runtime's nodes are cheap enough to share one activity (``run_group``)."""
    grouping: ClassVar[Grouping] = Grouping()
    """How large a group of its nodes grows (when :attr:`grouped`). The prepare activity puts
    the run's grouping on its plan (``OperationPlan.grouping``), and the walk reads it from
    there, so a run groups the same way on every worker and on replay."""

    id_reference_fields: ClassVar[tuple[str, ...]] = ()
    """Attributes that list resource ids, each meaning what ``$kusion_path.<id>`` means: a
    dependency, whose live state the runtime is given in its place (OnPrem: a Service's
    ``restartOn``). :func:`stackflow.engine.graph.expand_id_references` writes them so
    when a spec is loaded; an entry written as a reference already stays as it is."""

    @property
    def runtime_name(self) -> str:
        return self.name or self.type_name.lower()

    def id_problem(self, resource_id: str) -> str | None:
        """Why ``resource_id`` breaks this type's id convention, or None (default: any id)."""
        return None

    def sensitive_paths(self, attributes: Mapping[str, Any]) -> list[str]:
        """Paths of ``attributes`` that hold secrets by their nature (a Kubernetes Secret's
        ``data``), never shown. Default: none (values the runtime records as sensitive are
        masked anyway, see :func:`stackflow.engine.masking.sensitive_paths_for`)."""
        return []

    def place(self, attributes: Mapping[str, Any]) -> str | None:
        """Where a resource lives, as ``<runtime>@<glob>`` entries of the worker's
        ``STACKFLOW_RUNTIME_QUEUES`` match it to pin it to a task queue (OnPrem: its host);
        None: nowhere in particular."""
        return None

    def implicit_dependencies(self, resources: Sequence[Described]) -> dict[str, list[str]]:
        """Edges ``resources`` imply without saying (``{dependent id: [dependency ids]}``),
        among this runtime's resources (a spec's, or a release's recorded ones: destroy
        derives them again). Default: none."""
        return {}

    def takes_over(self, extensions: Mapping[str, Any]) -> str | None:
        """How a resource with these ``extensions`` takes over an object stackflow did not make
        (adopts or imports it), for a line naming it, or None (default: it never does).
        Taking over is an approver's decision (:mod:`stackflow.engine.takeover`)."""
        return None


def resolve(path: str, what: str) -> Any:
    """The object a class path ``"package.module:Name"`` names (imported now: call it on a
    worker, not while validating a spec); RuntimeLoadError (one line, naming ``what`` and the
    path) when it does not import."""
    module, _, name = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise RuntimeLoadError(f"{what} ({path}) does not load: {exc}") from exc
    return found


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
        if not isinstance(getattr(rules, "runtime", None), str) or ":" not in rules.runtime:
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} ({point.value}) names no runtime class "
                f"(RuntimeRules.runtime = 'package.module:Class')"
            )
        other = found.get(rules.type_name)
        if other is not None and type(other) is not type(rules):
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} declares type {rules.type_name!r}, "
                f"which {type(other).__module__} declares already"
            )
        named = next(
            (r for r in found.values() if r.runtime_name == rules.runtime_name and r is not other),
            None,
        )
        if named is not None:
            raise RuntimeLoadError(
                f"runtime entry point {point.name!r} names its runtime {rules.runtime_name!r}, "
                f"as the runtime of type {named.type_name!r} does already"
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
