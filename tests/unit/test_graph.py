"""DAG rules: dependsOn and $kusion_path edges, rejections, layers and orders."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.core.errors import GraphError, SpecError
from stackflow.engine.graph import (
    Graph,
    Reference,
    build_graph,
    find_references,
    match_reference,
    resolve_references,
)
from stackflow.engine.spec import parse_spec
from stackflow.model.spec import Resource, ResourceType, Spec

DEPLOY = "apps/v1:Deployment:ns:web"
NS = "v1:Namespace:ns"
PW = "hashicorp:random:random_password:pw"


def spec_of(*resources: dict[str, Any]) -> Spec:
    """A Spec built without parse_spec (which would already run build_graph)."""
    return Spec(resources=[Resource.model_validate({"type": "OnPrem", **r}) for r in resources])


def test_depends_on_and_references_make_edges() -> None:
    spec = Spec(
        resources=[
            Resource(
                id=DEPLOY,
                type=ResourceType.Kubernetes,
                attributes={
                    "spec": {"env": [{"value": f"$kusion_path.{PW}.result"}]},
                    "ns": f"$kusion_path.{NS}.metadata.name",
                },
            ),
            Resource(id=NS, type=ResourceType.Kubernetes),
            Resource(id=PW, type=ResourceType.Terraform, depends_on=[NS]),
        ]
    )
    g = build_graph(spec)
    assert g.ids == [DEPLOY, NS, PW]
    assert g.dependencies(DEPLOY) == sorted([PW, NS])
    assert g.dependents(NS) == sorted([DEPLOY, PW])
    assert g.layers() == [[NS], [PW], [DEPLOY]]
    assert g.reverse_layers() == [[DEPLOY], [PW], [NS]]
    assert g.topological_order() == [NS, PW, DEPLOY]
    assert g.reverse_topological_order() == [DEPLOY, PW, NS]
    assert set(g.edges) == {(NS, DEPLOY), (PW, DEPLOY), (NS, PW)}


def test_layers_sorted_within_layer() -> None:
    g = build_graph(spec_of({"id": "c"}, {"id": "a"}, {"id": "b", "dependsOn": ["c", "a"]}))
    assert g.layers() == [["a", "c"], ["b"]]


def test_duplicate_dependency_counts_once() -> None:
    g = build_graph(
        spec_of(
            {"id": "a"},
            {"id": "b", "dependsOn": ["a", "a"], "attributes": {"x": "$kusion_path.a.y"}},
        )
    )
    assert g.edges == [("a", "b")]
    assert g.layers() == [["a"], ["b"]]


def test_longest_id_wins() -> None:
    known = {"a", "a.b", "a.b.c:d"}
    assert match_reference("$kusion_path.a.b.c:d.x.y", known) == Reference("a.b.c:d", "x.y")
    assert match_reference("$kusion_path.a.b.z", known) == Reference("a.b", "z")
    assert match_reference("$kusion_path.a.b", known) == Reference("a.b", "")
    assert match_reference("$kusion_path.zzz.b", known) is None
    assert match_reference("kusion_path.a.b", known) is None


def test_ids_with_dots_slashes_colons() -> None:
    dotted = "apps.kusionstack.io/v1alpha1:PodTransitionRule:fakeNs:default-dev-foo"
    refs = find_references(
        {"a": [f"$kusion_path.{dotted}.spec.rules[0].name", "plain"], "b": f"$kusion_path.{PW}"},
        [dotted, PW],
    )
    assert refs == [Reference(dotted, "spec.rules[0].name"), Reference(PW, "")]


@pytest.mark.parametrize(
    ("resources", "pattern"),
    [
        (
            [{"id": "a"}, {"id": "b"}, {"id": "a"}],
            r"resources\[2\] \(id 'a'\): id: duplicate of resources\[0\]",
        ),
        ([{"id": "a", "dependsOn": ["nope"]}], r"dependsOn: unknown resource 'nope'"),
        (
            [{"id": "a", "attributes": {"x": "$kusion_path.nope.f"}}],
            r"attributes: reference '\$kusion_path.nope.f' names no resource",
        ),
        (
            [
                {"id": "a", "dependsOn": ["b"]},
                {"id": "b", "dependsOn": ["c"]},
                {"id": "c", "dependsOn": ["a"]},
            ],
            "dependency cycle: a -> b -> c -> a",
        ),
        (
            [{"id": "x"}, {"id": "c", "dependsOn": ["b"]}, {"id": "b", "dependsOn": ["c"]}],
            "dependency cycle: c -> b -> c",
        ),
        ([{"id": "a", "attributes": {"x": "$kusion_path.a.y"}}], "dependency cycle: a -> a"),
    ],
)
def test_rejections(resources: list[dict[str, Any]], pattern: str) -> None:
    with pytest.raises(GraphError, match=pattern):
        build_graph(spec_of(*resources))


def test_cycle_reached_through_acyclic_prefix() -> None:
    with pytest.raises(GraphError, match=r"dependency cycle: b -> c -> d -> b$"):
        build_graph(
            spec_of(
                {"id": "a", "dependsOn": ["b"]},
                {"id": "b", "dependsOn": ["c"]},
                {"id": "c", "dependsOn": ["d"]},
                {"id": "d", "dependsOn": ["b"]},
            )
        )


def test_from_dependencies() -> None:
    g = Graph.from_dependencies({"b": ["a"], "a": [], "c": ["b", "a"]})
    assert g.ids == ["b", "a", "c"]
    assert g.reverse_layers() == [["c"], ["b"], ["a"]]
    with pytest.raises(GraphError, match="unknown resource 'gone'"):
        Graph.from_dependencies({"a": ["gone"]})
    assert Graph.from_dependencies({"a": ["gone"]}, ignore_unknown=True).layers() == [["a"]]
    assert len(g) == 3 and "a" in g and "z" not in g


def test_empty_graph() -> None:
    g = build_graph(Spec(resources=[]))
    assert g.layers() == [] and g.edges == [] and g.topological_order() == []


def test_resolve_references() -> None:
    live: dict[str, dict[str, Any]] = {
        NS: {"metadata": {"name": "ns"}},
        PW: {"result": "s3cret", "list": [{"v": 1}]},
    }
    value: dict[str, Any] = {
        "a": f"$kusion_path.{NS}.metadata.name",
        "b": [f"$kusion_path.{PW}.list[0].v", "keep"],
        "c": f"$kusion_path.{PW}",
        "d": 5,
        "e": f"prefix $kusion_path.{PW}.result",  # not a whole string: left alone
    }
    out = resolve_references(value, live)
    assert out == {
        "a": "ns",
        "b": [1, "keep"],
        "c": live[PW],
        "d": 5,
        "e": f"prefix $kusion_path.{PW}.result",
    }
    assert value["a"].startswith("$kusion_path")  # input untouched


def test_resolve_missing_path_names_reference_and_resource() -> None:
    with pytest.raises(
        SpecError,
        match=rf"reference '\$kusion_path.{NS}.status.x': resource '{NS}' has no field status",
    ):
        resolve_references(f"$kusion_path.{NS}.status.x", {NS: {"metadata": {}}})
    with pytest.raises(SpecError, match="has no live state"):
        resolve_references("$kusion_path.other.x", {NS: {}})


def test_files_and_directories_inside_a_directory_depend_on_the_nearest_one() -> None:
    def onprem(kind: str, path: str, **extra: object) -> dict[str, object]:
        return {
            "id": f"{kind}:{path}",
            "type": "OnPrem",
            "attributes": {"kind": kind, "path": path, **extra},
        }

    spec = parse_spec(
        {
            "resources": [
                onprem("File", "/srv/app/conf/a.conf"),
                onprem("File", "/srv/app/conf/../b.conf"),
                onprem("Directory", "/srv/app/conf"),
                onprem("Directory", "/srv/app"),
                onprem("File", "/srv/other.conf"),
                onprem("File", "/srv/app/remote.conf", host="db1"),
                onprem("Directory", "/srv/app/x"),
            ]
        }
    )
    g = build_graph(spec)
    assert g.dependencies("File:/srv/app/conf/a.conf") == ["Directory:/srv/app/conf"]
    assert g.dependencies("File:/srv/app/conf/../b.conf") == ["Directory:/srv/app"]
    assert g.dependencies("Directory:/srv/app/conf") == ["Directory:/srv/app"]
    assert g.dependencies("Directory:/srv/app/x") == ["Directory:/srv/app"]
    assert g.dependencies("File:/srv/other.conf") == []
    assert g.dependencies("File:/srv/app/remote.conf") == []  # another host's file
    assert g.reverse_topological_order()[-1] == "Directory:/srv/app"


def test_recorded_directories_are_deleted_after_their_files_even_without_recorded_edges() -> None:
    from stackflow.activities.prepare import deletion_graph
    from stackflow.model.spec import Resource

    def recorded(kind: str, path: str, deps: list[str] | None = None) -> Resource:
        return Resource.model_validate(
            {
                "id": path,
                "type": "OnPrem",
                "attributes": {"kind": kind, "path": path, "mode": "0644"},
                "dependsOn": deps or [],
            }
        )

    graph, _ = deletion_graph([recorded("File", "/d/a"), recorded("Directory", "/d")])
    assert graph.reverse_topological_order() == ["/d/a", "/d"]
    # a recorded edge the other way round (written by hand) wins over the implicit one
    graph, _ = deletion_graph([recorded("File", "/d/a"), recorded("Directory", "/d", ["/d/a"])])
    assert graph.reverse_topological_order() == ["/d", "/d/a"]
