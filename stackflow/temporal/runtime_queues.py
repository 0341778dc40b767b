"""Workers per runtime: which task queue each runtime's activities go to, and which runtimes
a worker serves.

By default every activity goes to the main task queue (``STACKFLOW_TASK_QUEUE``) and one
worker serves everything, as the dev loop runs. With ``STACKFLOW_RUNTIME_QUEUES`` set
(``on``: ``<main queue>-<runtime>`` for each runtime, e.g. ``stackflow-kubernetes``; or
``kubernetes=q1,terraform=q2``), the activities that call a runtime (preview and refresh
batches, applies, deletes, groups) go to that runtime's queue, and workflows with the
bookkeeping activities stay on the main one. ``stackflow worker --runtimes main,kubernetes``
polls the main queue and the Kubernetes queue and builds only the Kubernetes runtime, so a
worker holds only the credentials and tools of the runtimes it serves.

The run's plan carries the routing (``OperationPlan.queues``, decided once by the prepare
activity), so a run's workflows route the same way on every worker and on replay; a
runtime activity waits at most ``STACKFLOW_RUNTIME_QUEUE_TIMEOUT`` seconds (default 300) for
a worker to pick it up, then the node fails naming the queue nobody polls.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stackflow.core.errors import StackflowError
from stackflow.model.runtime_rules import all_rules

QUEUES_VAR = "STACKFLOW_RUNTIME_QUEUES"
WAIT_VAR = "STACKFLOW_RUNTIME_QUEUE_TIMEOUT"
RUNTIMES_VAR = "STACKFLOW_WORKER_RUNTIMES"
DEFAULT_WAIT = 300.0
MAIN = "main"


def runtime_names() -> dict[str, str]:
    """Every installed runtime's name in options and queue names (``RuntimeRules.name``:
    ``kubernetes``, ``terraform``, ``onprem``, a plug-in's) -> the resource type it manages."""
    return {rules.runtime_name: type_name for type_name, rules in sorted(all_rules().items())}


class RoutingError(StackflowError):
    """The worker's routing settings are invalid (a worker problem: it does not start)."""


def _name_of(type_name: str) -> str:
    for name, known in runtime_names().items():
        if known == type_name:
            return name
    return type_name.lower()


def runtime_queues(main_queue: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Routing key -> task queue (empty: everything on the main queue). A key is a resource
    type, or ``<type>@<glob>`` for the resources of that type whose place (``RuntimeRules.
    place``: an OnPrem host's name) the glob matches: a host pinned to a worker near it."""
    env = os.environ if environ is None else environ
    raw = env.get(QUEUES_VAR, "").strip()
    if raw.lower() in ("", "off", "0", "no", "false"):
        return {}
    known = runtime_names()
    queues: dict[str, str] = {}
    for item in raw.split(","):
        if item.strip().lower() in ("on", "1", "yes", "true"):
            queues.update({t: f"{main_queue}-{name}" for name, t in known.items()})
            continue
        key, sep, queue = item.strip().partition("=")
        name, at, glob = key.strip().lower().partition("@")
        if not sep or name not in known or not queue.strip() or (at and not glob):
            raise RoutingError(
                f"{QUEUES_VAR}={raw!r}: expected 'on' or '<runtime>[@<host glob>]=<queue>,...' "
                f"(runtimes: {', '.join(known)})"
            )
        queues[known[name] + (f"@{key.strip().partition('@')[2]}" if at else "")] = queue.strip()
    return queues


def route(type_name: str, place: str | None, queues: Mapping[str, str]) -> str | None:
    """The pinned routing key (``<type>@<glob>``) of a resource at ``place``, the first
    glob matching it; None: its type's queue."""
    if place is None:
        return None
    for key in queues:
        found, at, glob = key.partition("@")
        if at and found == type_name and fnmatch.fnmatchcase(place, glob):
            return key
    return None


def queue_wait(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(WAIT_VAR, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_WAIT
    except ValueError:
        raise RoutingError(f"{WAIT_VAR}={raw!r}: a number of seconds") from None
    if value <= 0:
        raise RoutingError(f"{WAIT_VAR}={raw!r}: a number of seconds above 0")
    return value


def plan_queues(keys: Iterable[str], queues: Mapping[str, str]) -> dict[str, str]:
    """The routing a plan carries: each of its nodes' routing keys (types, pinned keys) ->
    its queue ("": the main queue, a runtime without one of its own); empty when routing
    is off."""
    if not queues:
        return {}
    return {t: queues.get(t, "") for t in sorted(set(keys))}


def parts(queues: Mapping[str, str]) -> list[tuple[str | None, list[str] | None]]:
    """How a preview range is split: ``(task queue, types)`` per queue (None: the run's own
    queue; types None: the whole range), one part when a single queue serves the plan."""
    by_queue: dict[str, list[str]] = {}
    for type_name, queue in sorted(queues.items()):
        by_queue.setdefault(queue, []).append(type_name)
    if len(by_queue) <= 1:
        queue = next(iter(by_queue), "")
        return [(queue or None, None)]
    return [(queue or None, types) for queue, types in sorted(by_queue.items())]


@dataclass(frozen=True)
class Serving:
    """What one worker process serves: the main queue (workflows and bookkeeping) and/or
    the queues of some runtimes (the types whose runtimes it builds)."""

    main: bool
    types: frozenset[str] | None
    """Resource types whose runtimes this worker builds (None: every one, routing off)."""
    queues: dict[str, str]
    """Runtime queue -> its resource type, for the runtime queues this worker polls."""

    def task_queues(self, main_queue: str) -> list[str]:
        return ([main_queue] if self.main else []) + sorted(self.queues)


def serving(
    main_queue: str, runtimes: str | None, environ: Mapping[str, str] | None = None
) -> Serving:
    """What ``--runtimes`` (or ``STACKFLOW_WORKER_RUNTIMES``; default all) asks this worker
    to serve, checked against the routing: a worker for some runtimes only needs runtime
    queues (``STACKFLOW_RUNTIME_QUEUES``), else it would take every runtime's work."""
    env = os.environ if environ is None else environ
    raw = (runtimes if runtimes is not None else env.get(RUNTIMES_VAR, "")).strip().lower()
    queues = runtime_queues(main_queue, env)
    known = runtime_names()
    every = set(known) | {MAIN}
    items = every if raw in ("", "all") else {n.strip() for n in raw.split(",") if n.strip()}
    # <runtime>@<glob>: that pinned queue only (all: every pinned queue too)
    pinned = {_pin_name(key, known): key for key in queues if "@" in key}
    wanted = {n for n in items if "@" not in n}
    chosen = set(pinned) if raw in ("", "all") else items - wanted
    unknown = (wanted - every) | (chosen - set(pinned))
    if unknown or not items:
        raise RoutingError(
            f"--runtimes {raw!r}: expected 'all' or a comma list of {', '.join(sorted(every))} "
            f"or pinned queues of {QUEUES_VAR} ({', '.join(sorted(pinned)) or 'none'})"
        )
    if wanted != every and not queues:
        raise RoutingError(
            f"--runtimes {raw}: a worker for some runtimes needs per-runtime task queues; set "
            f"{QUEUES_VAR}=on on every worker (else every activity is on the main queue)"
        )
    if not queues:
        return Serving(main=True, types=None, queues={})
    polled = {queues[known[n]]: known[n] for n in wanted if n in known and known[n] in queues}
    polled.update({queues[pinned[n]]: pinned[n].partition("@")[0] for n in chosen})
    types = frozenset(known[n] for n in wanted if n in known) | frozenset(polled.values())
    return Serving(main=MAIN in wanted, types=types, queues=polled)


def _pin_name(key: str, known: Mapping[str, str]) -> str:
    """``OnPrem@db1`` as ``--runtimes`` names it: ``onprem@db1``."""
    type_name, _, glob = key.partition("@")
    return f"{_name_of(type_name)}@{glob}".lower()


def no_worker_message(queue: str, type_name: str, wait: float) -> str:
    """The one line of a runtime activity nobody picked up."""
    return (
        f"no worker polls task queue {queue!r} ({type_name} resources): nothing took the "
        f"task within {wait:g}s ({WAIT_VAR}); start `stackflow worker --runtimes "
        f"{_name_of(type_name)}` with {QUEUES_VAR} set"
    )
