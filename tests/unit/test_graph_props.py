"""Property tests: random DAGs are layered consistently; random cycles are always rejected."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from stackflow.core.errors import GraphError
from stackflow.engine.graph import Graph


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """Acyclic: node i may only depend on nodes of a lower index, in shuffled input order."""
    n = draw(st.integers(0, 30))
    names = [f"r{i}" for i in range(n)]
    deps = {
        names[i]: draw(st.lists(st.sampled_from(names[:i]), max_size=4)) if i else []
        for i in range(n)
    }
    order = draw(st.permutations(names))
    return {name: deps[name] for name in order}


@settings(max_examples=150, deadline=None)
@given(dags())
def test_layers_respect_every_edge(deps: dict[str, list[str]]) -> None:
    g = Graph.from_dependencies(deps)
    layer_of = {rid: i for i, layer in enumerate(g.layers()) for rid in layer}
    assert sorted(layer_of) == sorted(deps)  # every node exactly once
    for dep, rid in g.edges:
        assert layer_of[dep] < layer_of[rid]
    destroy = {rid: i for i, layer in enumerate(g.reverse_layers()) for rid in layer}
    for dep, rid in g.edges:
        assert destroy[rid] < destroy[dep]
    order = g.topological_order()
    position = {rid: i for i, rid in enumerate(order)}
    assert all(position[d] < position[r] for d, r in g.edges)
    assert g.reverse_topological_order() == order[::-1]
    for layer in g.layers():
        assert layer == sorted(layer)
    # deterministic: the same input gives the same answer
    assert Graph.from_dependencies(deps).layers() == g.layers()


@settings(max_examples=150, deadline=None)
@given(dags(), st.data())
def test_any_added_back_edge_is_a_cycle(deps: dict[str, list[str]], data: st.DataObject) -> None:
    g = Graph.from_dependencies(deps)
    edges = g.edges
    if not edges:
        cyclic = {"x": ["x"]}
    else:
        # close a cycle: pick a path edge (dep -> rid) and make dep depend on rid
        dep, rid = data.draw(st.sampled_from(edges))
        cyclic = {k: list(v) for k, v in deps.items()}
        cyclic[dep].append(rid)
    try:
        Graph.from_dependencies(cyclic)
    except GraphError as err:
        text = str(err)
        assert text.startswith("dependency cycle: ")
        cycle = text.removeprefix("dependency cycle: ").split(" -> ")
        assert cycle[0] == cycle[-1] and len(cycle) >= 2
        for a, b in itertools.pairwise(cycle):
            assert b in cyclic[a]  # every printed step is a real dependency
    else:
        raise AssertionError("a cyclic graph was accepted")
