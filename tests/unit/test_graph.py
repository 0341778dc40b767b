"""DAG rules: dependsOn and $kusion_path edges (and ids a runtime reads as references),
rejections, layers and orders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
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
from stackflow.engine.spec import load_stored_spec, parse_spec
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


CONF = "onprem:File:/etc/demo/demo.conf"
UNIT = "/etc/systemd/system/demo.service"


def service_spec(*restart_on: Any, kind: str = "Service") -> dict[str, Any]:
    """A File and a Service restarted when listed resources change (as written by hand)."""
    return {
        "resources": [
            {"id": CONF, "type": "OnPrem", "attributes": {"kind": "File", "path": "/etc/a"}},
            {"id": "v1:ConfigMap:ns:x", "type": "Kubernetes", "attributes": {"restartOn": ["x"]}},
            {
                "id": "svc",
                "type": "OnPrem",
                "attributes": {"kind": kind, "path": UNIT, "restartOn": list(restart_on)},
            },
        ]
    }


def test_ids_a_runtime_reads_as_references_are_the_reference_form() -> None:
    """OnPrem's ``restartOn`` lists ids: each means ``$kusion_path.<id>`` (an edge, the whole
    live state in its place), so both forms make the same spec, graph and resolution; an
    attribute of that name of another runtime's resource is left as written."""
    bare = parse_spec(service_spec(CONF, {"kept": 1}))
    as_reference = parse_spec(service_spec(f"$kusion_path.{CONF}", {"kept": 1}))
    assert bare == as_reference
    attrs = bare.resources[2].attributes
    assert attrs["restartOn"] == [f"$kusion_path.{CONF}", {"kept": 1}]
    assert bare.resources[1].attributes["restartOn"] == ["x"]
    g = build_graph(bare)
    assert g.edges == build_graph(as_reference).edges == [(CONF, "svc")]
    assert find_references(attrs, g.ids) == [Reference(CONF, "")]
    live = {CONF: {"kind": "File", "path": "/etc/a", "content": "a=1\n"}}
    assert resolve_references(attrs["restartOn"], live) == [live[CONF], {"kept": 1}]
    # loading it again (a stored spec) changes nothing; one stored raw is expanded the same
    assert load_stored_spec(bare.model_dump(by_alias=True), "ref") == bare
    assert load_stored_spec(service_spec(CONF, {"kept": 1}), "ref") == bare


@pytest.mark.parametrize("loader", [parse_spec, load_stored_spec])
def test_an_unknown_id_where_a_runtime_reads_references_is_one_line(loader: Any) -> None:
    with pytest.raises(GraphError) as err:
        loader(service_spec(CONF, "onprem:File:/etc/nope"), "spec.yaml")
    assert str(err.value) == (
        "spec.yaml: resources[2] (id 'svc'): attributes.restartOn[1]: "
        "unknown resource 'onprem:File:/etc/nope'"
    )
    assert err.value.exit_code == 2
    with pytest.raises(GraphError, match="dependency cycle: svc -> svc"):
        parse_spec(service_spec("svc"))


def test_the_cli_validates_and_graphs_restart_on_ids(tmp_path: Path) -> None:
    """``stackflow validate`` refuses an unknown id (exit 2, one line); ``graph`` shows the
    edge of a listed id."""
    spec = tmp_path / "spec.yaml"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "stackflow.cli.main", *args, "-f", str(spec)]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    spec.write_text(json.dumps(service_spec(CONF)))
    shown = run("graph", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["edges"] == [[CONF, "svc"]]
    spec.write_text(json.dumps(service_spec("nope")))
    bad = run("validate")
    assert bad.returncode == 2, bad
    assert bad.stderr.strip().splitlines() == [
        f"Error: {spec}: resources[2] (id 'svc'): attributes.restartOn[0]: unknown resource 'nope'"
    ]
