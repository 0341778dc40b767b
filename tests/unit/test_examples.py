"""Every spec under examples/ is valid, with the dependency order the docs describe
(docs/guide/resources.md: mixed.yaml hands a random_password to a Secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackflow.engine.graph import build_graph
from stackflow.engine.spec import load_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"onprem.yaml", "kubernetes.yaml", "mixed.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_a_valid_spec(path: Path) -> None:
    graph = build_graph(load_spec(path))
    assert graph.layers()


def test_the_secret_waits_for_the_password() -> None:
    graph = build_graph(load_spec(next(p for p in EXAMPLES if p.name == "mixed.yaml")))
    order = graph.topological_order()
    assert order.index("hashicorp:random:random_password:db") < order.index(
        "v1:Secret:default:db-credentials"
    )
