"""The resource DAG: edges from ``dependsOn``, ``$kusion_path`` references (and the resource
ids a runtime's rules read as such) and implicit ones (containment).

Pure and deterministic (no I/O, no iteration over sets to decide order) so that Temporal
workflow code may call it. Edges point from the dependency to the dependent.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from stackflow.core.errors import GraphError, SpecError
from stackflow.core.paths import PathError, get_path, parse_path
from stackflow.model.runtime_rules import Described, all_rules

if TYPE_CHECKING:
    from stackflow.model.spec import Spec

KUSION_PATH_PREFIX = "$kusion_path."


class Reference(NamedTuple):
    """``$kusion_path.<resource_id>.<path>``: ``path`` is "" for the whole live object."""

    resource_id: str
    path: str


def match_reference(text: str, known_ids: Container[str]) -> Reference | None:
    """Split a ``$kusion_path`` string at the longest known id followed by ``.`` or the end."""
    if not text.startswith(KUSION_PATH_PREFIX):
        return None
    rest = text[len(KUSION_PATH_PREFIX) :]
    if rest in known_ids:
        return Reference(rest, "")
    cut = rest.rfind(".")
    while cut > 0:
        if rest[:cut] in known_ids:
            return Reference(rest[:cut], rest[cut + 1 :])
        cut = rest.rfind(".", 0, cut)
    return None


def _walk_strings(value: Any) -> Iterable[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)  # exact type checks first: isinstance against an ABC is slow
        if kind is str:
            if item.startswith(KUSION_PATH_PREFIX):
                yield item
        elif kind is dict or isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif kind is list or isinstance(item, list | tuple):
            stack.extend(reversed(item))


def find_references(value: Any, known_ids: Iterable[str]) -> list[Reference]:
    """Every ``$kusion_path`` reference in ``value`` (document order, duplicates kept).

    Raises GraphError for a reference to no known id.
    """
    known: Container[str] = (
        known_ids if isinstance(known_ids, set | frozenset | dict) else set(known_ids)
    )
    refs: list[Reference] = []
    for text in _walk_strings(value):
        ref = match_reference(text, known)
        if ref is None:
            raise GraphError(f"reference {text!r} names no resource of the spec")
        refs.append(ref)
    return refs


def resolve_references(value: Any, live: Mapping[str, Mapping[str, Any]]) -> Any:
    """A copy of ``value`` with every whole-string reference replaced from ``live[id]``."""
    if isinstance(value, str):
        if not value.startswith(KUSION_PATH_PREFIX):
            return value
        ref = match_reference(value, live)
        if ref is None:
            raise SpecError(f"reference {value!r}: the resource has no live state")
        try:
            segments = parse_path(ref.path) if ref.path else []
            return get_path(live[ref.resource_id], segments)
        except PathError as err:
            raise SpecError(f"reference {value!r}: resource {ref.resource_id!r} has {err}") from err
    if isinstance(value, Mapping):
        return {k: resolve_references(v, live) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve_references(v, live) for v in value]
    return value


class Graph:
    """Dependencies between resource ids (see :func:`build_graph`, ``from_dependencies``)."""

    def __init__(self, ids: Sequence[str], dependencies: Mapping[str, Sequence[str]]) -> None:
        self.ids: list[str] = list(ids)
        self._index = {rid: i for i, rid in enumerate(self.ids)}
        self._deps: dict[str, list[str]] = {
            rid: sorted(set(dependencies.get(rid, ()))) for rid in self.ids
        }
        dependents: dict[str, list[str]] = {rid: [] for rid in self.ids}
        for rid in self.ids:
            for dep in self._deps[rid]:
                if dep not in dependents:
                    raise GraphError(f"resource {rid!r} depends on unknown resource {dep!r}")
                dependents[dep].append(rid)
        self._dependents = {rid: sorted(v) for rid, v in dependents.items()}
        self._layers = self._compute_layers()

    @classmethod
    def from_dependencies(
        cls, deps: Mapping[str, Iterable[str]], *, ignore_unknown: bool = False
    ) -> Graph:
        """A graph from ``{id: [dependency ids]}`` (e.g. a release state, for destroy).

        With ``ignore_unknown`` dependencies outside ``deps`` (already gone) are dropped.
        """
        ids = list(deps)
        known = set(ids)
        table = {
            rid: [d for d in found if not ignore_unknown or d in known]
            for rid, found in ((rid, list(deps[rid])) for rid in ids)
        }
        return cls(ids, table)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, rid: object) -> bool:
        return rid in self._index

    def dependencies(self, rid: str) -> list[str]:
        return list(self._deps[rid])

    def dependents(self, rid: str) -> list[str]:
        return list(self._dependents[rid])

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(dependency, dependent) pairs, in input order of the dependent."""
        return [(dep, rid) for rid in self.ids for dep in self._deps[rid]]

    def layers(self) -> list[list[str]]:
        """Layers of a topological order: each id only depends on ids of earlier layers."""
        return [list(layer) for layer in self._layers]

    def reverse_layers(self) -> list[list[str]]:
        """Layers for destroy: dependents before their dependencies."""
        return [list(layer) for layer in reversed(self._layers)]

    def topological_order(self) -> list[str]:
        return [rid for layer in self._layers for rid in layer]

    def reverse_topological_order(self) -> list[str]:
        """Destroy order: exactly ``topological_order()`` reversed."""
        return self.topological_order()[::-1]

    def _compute_layers(self) -> list[list[str]]:
        """Kahn's algorithm by layers, O(V+E) plus sorting within layers."""
        pending = {rid: len(self._deps[rid]) for rid in self.ids}
        layer = sorted(rid for rid in self.ids if pending[rid] == 0)
        layers: list[list[str]] = []
        placed = 0
        while layer:
            layers.append(layer)
            placed += len(layer)
            following: list[str] = []
            for rid in layer:
                for dependent in self._dependents[rid]:
                    pending[dependent] -= 1
                    if pending[dependent] == 0:
                        following.append(dependent)
            layer = sorted(following)
        if placed != len(self.ids):
            raise GraphError(f"dependency cycle: {' -> '.join(self._find_cycle(pending))}")
        return layers

    def _find_cycle(self, pending: Mapping[str, int]) -> list[str]:
        """A cycle among the ids Kahn could not place, following dependsOn (a -> b: a needs b)."""
        stuck = [rid for rid in self.ids if pending[rid] > 0]
        blocked = set(stuck)
        start = stuck[0]
        # Every stuck node has a stuck dependency, so walking dependencies must revisit a node.
        seen: dict[str, int] = {}
        path: list[str] = []
        node = start
        while node not in seen:
            seen[node] = len(path)
            path.append(node)
            node = next(d for d in self._deps[node] if d in blocked)
        cycle = path[seen[node] :]
        # Rotate so the cycle starts at its first id in input order: deterministic output.
        first = min(range(len(cycle)), key=lambda i: self._index[cycle[i]])
        cycle = cycle[first:] + cycle[:first]
        return [*cycle, cycle[0]]


def implicit_dependencies(resources: Sequence[Described]) -> dict[str, list[str]]:
    """Every implicit edge of ``resources``: each runtime adds those its resources imply
    (:meth:`RuntimeRules.implicit_dependencies`: an OnPrem File inside a Directory of the
    same stack, a Kubernetes custom resource after its CustomResourceDefinition)."""
    found: dict[str, list[str]] = {}
    for rules in all_rules().values():
        for rid, deps in rules.implicit_dependencies(resources).items():
            found.setdefault(rid, []).extend(deps)
    return found


def expand_id_references(spec: Spec) -> None:
    """Each resource id listed in an attribute its runtime names in
    :attr:`RuntimeRules.id_reference_fields`, rewritten in place as the ``$kusion_path.<id>``
    reference it means (an entry that is a reference already stays), so the graph, the
    resolution and the plan are the reference form's. GraphError for an id of no resource."""
    fields = {t: r.id_reference_fields for t, r in all_rules().items() if r.id_reference_fields}
    ids: set[str] = set()
    for index, resource in enumerate(spec.resources):
        for name in fields.get(resource.type, ()):
            listed = resource.attributes.get(name)
            if not isinstance(listed, list):
                continue
            ids = ids or {r.id for r in spec.resources}
            expanded = []
            for n, entry in enumerate(listed):
                if isinstance(entry, str) and not entry.startswith(KUSION_PATH_PREFIX):
                    if entry not in ids:
                        raise GraphError(
                            f"resources[{index}] (id {resource.id!r}): attributes.{name}[{n}]: "
                            f"unknown resource {entry!r}"
                        )
                    entry = KUSION_PATH_PREFIX + entry
                expanded.append(entry)
            resource.attributes[name] = expanded


def build_graph(spec: Spec) -> Graph:
    """The DAG of a spec; raises GraphError for duplicate/unknown ids, bad references, cycles."""
    seen: dict[str, int] = {}
    for index, resource in enumerate(spec.resources):
        if resource.id in seen:
            first = seen[resource.id]
            raise GraphError(
                f"resources[{index}] (id {resource.id!r}): id: duplicate of resources[{first}]"
            )
        seen[resource.id] = index
    deps: dict[str, list[str]] = {}
    implicit = implicit_dependencies(spec.resources)
    for index, resource in enumerate(spec.resources):
        where = f"resources[{index}] (id {resource.id!r})"
        for dep in resource.depends_on:
            if dep not in seen:
                raise GraphError(f"{where}: dependsOn: unknown resource {dep!r}")
        try:
            refs = find_references(resource.attributes, seen)
        except GraphError as err:
            raise GraphError(f"{where}: attributes: {err}") from err
        deps[resource.id] = [
            *resource.depends_on,
            *(ref.resource_id for ref in refs),
            *implicit.get(resource.id, ()),
        ]
    return Graph([r.id for r in spec.resources], deps)
