"""Stack sets: the set file, ``$stack.`` references, the order of the stacks and resolving."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stackflow.core.errors import SpecError
from stackflow.engine.stack_set import (
    MAX_SET_BYTES,
    check_set,
    load_set_text,
    order_members,
    reference_value,
    references,
    resolve,
    split_reference,
)
from stackflow.model.spec import Spec
from stackflow.model.stack_set import StackReference
from stackflow.temporal.stack_set import SetInput

SHOP = """
name: shop
stacks:
  - {project: network, workspace: prod, spec: network.yaml}
  - {project: database, workspace: prod, spec: db.yaml, dependsOn: [network/prod]}
  - project: checkout
    workspace: prod
    git:
      url: https://git.example/shop.git
      ref: 0123456789abcdef0123456789abcdef01234567
      path: deploy/spec.yaml
"""

IDS = {
    "network/prod": {"onprem:File:/etc/net.conf", "onprem:File:/etc/net"},
    "database/prod.eu": {"hashicorp:random:random_password:pw"},
}


def test_a_set_file_loads() -> None:
    shop = load_set_text(SHOP, "stacks.yaml")
    assert shop.name == "shop"
    assert [m.name for m in shop.stacks] == ["network/prod", "database/prod", "checkout/prod"]
    assert shop.stacks[1].depends_on == ["network/prod"]
    git = shop.stacks[2].git
    assert git is not None and git.source().commit.startswith("0123")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: s\nstacks: []\n", "stacks.yaml: stacks: List should have at least 1 item"),
        (
            "name: s\nstacks:\n  - {project: a, spec: a.yaml, git: {url: u, ref: r, path: p}}\n",
            "stacks.yaml: stacks[0].git.ref: String should match pattern",
        ),
        (
            "name: s\nstacks:\n  - {project: a}\n",
            "stacks.yaml: stacks[0]: give one of spec (a file) and git {url, ref, path}",
        ),
        (
            "name: s\nstacks:\n  - {project: a, spec: a.yaml, dependson: []}\n",
            "stacks.yaml: stacks[0].dependson: unknown field",
        ),
        (
            "name: s\nstacks:\n  - {project: a, spec: a.yaml, dependsOn: [b]}\n",
            "stacks.yaml: stacks[0].dependsOn: 'b' is not a stack: write project/workspace",
        ),
        (
            "name: s\nstacks:\n  - {project: a, spec: a.yaml}\n  - {project: a, spec: b.yaml}\n",
            "stacks.yaml: set: stacks[1]: a/default is named twice",
        ),
        ("- a\n", "stacks.yaml: a set is a mapping with 'name' and 'stacks'"),
        ("name: [", "stacks.yaml: invalid YAML"),
    ],
)
def test_a_bad_set_file_is_one_line_naming_where(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_set_text(text, "stacks.yaml")
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_a_set_file_has_the_spec_loaders_budgets() -> None:
    with pytest.raises(SpecError, match="the limit is"):
        load_set_text(b"#" * (MAX_SET_BYTES + 1), "big.yaml")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    with pytest.raises(SpecError, match="excessive aliasing"):
        load_set_text(bomb, "bomb.yaml")


def test_a_reference_splits_at_known_stacks_and_ids() -> None:
    ref = split_reference("$stack.network/prod.onprem:File:/etc/net.conf.content", IDS.get)
    assert ref == StackReference("network/prod", "onprem:File:/etc/net.conf", "content")
    # a workspace with a dot, a field path with an index
    ref = split_reference(
        "$stack.database/prod.eu.hashicorp:random:random_password:pw.result[0]", IDS.get
    )
    assert ref == StackReference(
        "database/prod.eu", "hashicorp:random:random_password:pw", "result[0]"
    )
    assert ref.text == "$stack.database/prod.eu.hashicorp:random:random_password:pw.result[0]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("$stack.nowhere", "write $stack.<project>/<workspace>.<resource id>.<field>"),
        ("$stack.network/dev.x.y", "names no stack (of the set, or with a release)"),
        (
            "$stack.network/prod.onprem:File:/nope.content",
            "stack network/prod has no such resource",
        ),
        ("$stack.network/prod.onprem:File:/etc/net", "name a field of 'onprem:File:/etc/net'"),
        ("$stack.network/prod.onprem:File:/etc/net.a[", "field 'a[':"),
    ],
)
def test_a_bad_reference_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        references({"a": [{"b": text}]}, IDS.get, "service/prod")
    assert str(err.value).startswith(f"service/prod: {text}"), str(err.value)
    assert message in str(err.value)


def test_references_are_distinct_and_only_whole_strings() -> None:
    text = "$stack.network/prod.onprem:File:/etc/net.mode"
    found = references({"a": text, "b": [text, f"x {text}"]}, IDS.get, "s")
    assert found == [StackReference("network/prod", "onprem:File:/etc/net", "mode")]


def test_members_order_and_cycles() -> None:
    names = ["service/prod", "database/prod", "network/prod", "other/prod"]
    order = order_members(names, [["database/prod"], ["network/prod"], [], []], "set shop")
    assert order.order == [2, 3, 1, 0]
    assert order.deps == [[1], [2], [], []]
    with pytest.raises(SpecError) as err:
        order_members(names, [["database/prod"], ["service/prod"], [], []], "set shop")
    path = str(err.value).split("set shop: a cycle between stacks: ")[1].split(" -> ")
    assert len(path) == 3 and path[0] == path[-1]
    assert set(path) == {"service/prod", "database/prod"}
    with pytest.raises(SpecError, match=r"set shop: service/prod: dependsOn x/y: not a stack"):
        order_members(names, [["x/y"], [], [], []], "set shop")
    with pytest.raises(SpecError, match="depends on itself"):
        order_members(names, [["service/prod"], [], [], []], "set shop")


def test_a_longer_cycle_names_its_path() -> None:
    names = ["a/x", "b/x", "c/x"]
    with pytest.raises(SpecError) as err:
        order_members(names, [["c/x"], ["a/x"], ["b/x"]], "set s")
    path = str(err.value).split("a cycle between stacks: ")[1].split(" -> ")
    assert len(path) == 4 and path[0] == path[-1] and set(path) == set(names)


def test_values_resolve_and_a_missing_field_is_named() -> None:
    ref = StackReference("database/prod", "pw", "result")
    assert reference_value(ref, {"result": "s3cret"}) == "s3cret"
    with pytest.raises(SpecError) as err:
        reference_value(ref, {"length": 8})
    assert str(err.value).startswith("$stack.database/prod.pw.result: 'pw' of database/prod has")
    with pytest.raises(SpecError, match="database/prod has no recorded 'pw'"):
        reference_value(ref, None)
    spec = {"data": {"password": ref.text, "keep": "x"}, "list": [ref.text]}
    assert resolve(spec, {ref.text: "v"}) == {"data": {"password": "v", "keep": "x"}, "list": ["v"]}


def test_the_workflow_input_refuses_what_a_run_cannot_do() -> None:
    member = {"project": "a", "workspace": "w", "spec": {"resources": []}}
    SetInput(name="s", members=[member])
    with pytest.raises(ValidationError, match="a/w is named twice"):
        SetInput(name="s", members=[member, member])
    with pytest.raises(ValidationError, match="a/w has no spec"):
        SetInput(name="s", members=[{"project": "a", "workspace": "w"}])
    SetInput(name="s", operation="destroy", members=[{"project": "a", "workspace": "w"}])
    with pytest.raises(ValidationError, match="not project/workspace"):
        SetInput(name="s", members=[{**member, "depends_on": ["nope"]}])


def _spec(*resources: tuple[str, dict[str, object]]) -> Spec:
    return Spec.model_validate(
        {"resources": [{"id": i, "type": "OnPrem", "attributes": a} for i, a in resources]}
    )


def test_a_set_is_checked_as_one_references_are_dependencies() -> None:
    names = ["service/prod", "database/prod"]
    specs = [
        _spec(("svc", {"p": "$stack.database/prod.pw.result", "o": "$stack.ext/prod.x.y"})),
        _spec(("pw", {"length": 8})),
    ]
    outside = {"ext/prod": {"x"}}
    order, reads = check_set("shop", names, specs, [[], []], outside.get)
    assert order.order == [1, 0] and order.deps == [[1], []]
    assert reads[0].upstream == {1: ["pw"]} and reads[0].references == 2
    specs[1] = _spec(("pw", {"again": "$stack.service/prod.svc.p"}))
    with pytest.raises(SpecError, match="a cycle between stacks"):
        check_set("shop", names, specs, [[], []], outside.get)
    specs[1] = _spec(("pw", {"me": "$stack.database/prod.pw.length"}))
    with pytest.raises(SpecError, match=r"set shop: database/prod: .*reads its own stack"):
        check_set("shop", names, specs, [[], []], outside.get)
    specs[1] = _spec(("pw", {"length": 8}))
    with pytest.raises(SpecError) as err:
        check_set("shop", names, specs, [[], []], {}.get)
    assert str(err.value) == (
        "set shop: service/prod: $stack.ext/prod.x.y: names no stack (of the set, or with a "
        "release)"
    )


def test_a_value_taken_from_a_secret_is_masked_in_release_views() -> None:
    from datetime import UTC, datetime

    from stackflow.core.refs import StackRef
    from stackflow.engine.masking import SENSITIVE_MARKER, masked_release_data
    from stackflow.engine.release_diff import diff_releases
    from stackflow.model.release import Phase, Release
    from stackflow.model.spec import SET_SECRETS

    def spec(password: str) -> Spec:
        resource = {"kind": "File", "path": "/tmp/p", "content": password, "mode": "0600"}
        return Spec.model_validate(
            {
                "resources": [
                    {"id": "onprem:File:/tmp/p", "type": "OnPrem", "attributes": resource}
                ],
                "context": {SET_SECRETS: [password], "kubeContext": "dev"},
            }
        )

    now = datetime.now(UTC)
    release = Release(
        project="p",
        workspace="w",
        revision=1,
        phase=Phase.succeeded,
        spec=spec("hunter22"),
        created_at=now,
        modified_at=now,
    )
    data = masked_release_data(release)
    assert "hunter22" not in str(data)
    assert data["spec"]["context"] == {SET_SECRETS: SENSITIVE_MARKER, "kubeContext": "dev"}
    assert data["spec"]["resources"][0]["attributes"]["content"] == SENSITIVE_MARKER
    assert data["spec"]["resources"][0]["attributes"]["mode"] == "0600"
    diff = diff_releases(StackRef("p", "w"), 1, spec("hunter22"), [], 2, spec("swordfish9"), [])
    assert "hunter22" not in diff.model_dump_json() and "swordfish9" not in diff.model_dump_json()


def test_the_example_set_is_valid_and_ordered() -> None:
    from pathlib import Path

    from stackflow.engine.spec import load_spec
    from stackflow.engine.stack_set import load_set_file

    path = Path(__file__).resolve().parents[2] / "examples" / "sets" / "stacks.yaml"
    shop = load_set_file(path)
    specs = [load_spec(path.parent / str(m.spec)) for m in shop.stacks]
    names = [m.name for m in shop.stacks]
    order, reads = check_set(shop.name, names, specs, [m.depends_on for m in shop.stacks], {}.get)
    assert [names[i] for i in order.order] == ["network/prod", "database/prod", "service/prod"]
    assert reads[2].upstream == {0: [specs[0].resources[0].id], 1: [specs[1].resources[0].id]}


def test_a_brief_result_names_the_first_changes() -> None:
    from stackflow.temporal.operation import NodeResult, NodeStatus
    from stackflow.workflows.lines import RESULT_BRIEF_LIMIT, result_brief

    changes = [{"id": f"r{i}", "type": "OnPrem", "action": "Update", "diff": []} for i in range(60)]
    view = {"changes": [{"id": "u", "type": "OnPrem", "action": "UnChanged"}, *changes]}
    ok = NodeResult(id="a", action="Update", status=NodeStatus.succeeded)
    bad = NodeResult(id="b", action="Update", status=NodeStatus.failed, error="no")
    brief, results = result_brief({**view, "summary": {"Update": 60, "UnChanged": 1}}, [ok, bad])
    assert len(brief["changes"]) == RESULT_BRIEF_LIMIT and brief["truncated"] is True
    assert brief["changes"][0] == {"id": "r0", "action": "Update"}
    assert results == [bad]
    assert result_brief({"changes": changes[:2], "summary": {}}, [])[0] == {
        "changes": [{"id": "r0", "action": "Update"}, {"id": "r1", "action": "Update"}],
        "summary": {},
    }


def test_waves_name_every_stack_once_in_order() -> None:
    from stackflow.engine.stack_set import check_waves, wave_members
    from stackflow.model.stack_set import Strategy

    names = ["web/dev", "web/stg", "web/prod-eu", "web/prod-us"]
    strategy = Strategy.model_validate(
        {
            "waves": [
                {"targets": ["web/dev"]},
                {"targets": ["web/stg"], "bake": "1m30s"},
                {"targets": ["web/prod-*"], "max_parallel": 2, "gate": "approval"},
            ],
            "error_budget": 1,
        }
    )
    assert strategy.waves[1].bake == 90.0
    waves = wave_members("r", names, strategy)
    assert waves == [[0], [1], [2, 3]]
    check_waves("r", names, [[], [0], [1], [1]], waves)
    with pytest.raises(SpecError, match=r"set r: web/stg \(wave 1\) depends on web/prod-eu"):
        check_waves("r", names, [[], [2], [], []], waves)
    with pytest.raises(SpecError, match="set r: web/prod-us is in no wave"):
        wave_members(
            "r", names, Strategy(waves=[{"targets": ["web/dev", "web/stg", "web/prod-eu"]}])
        )
    with pytest.raises(SpecError, match="web/dev is in waves 0 and 1"):
        wave_members("r", names, Strategy(waves=[{"targets": ["web/*"]}, {"targets": ["web/dev"]}]))
    with pytest.raises(SpecError, match=r"strategy.waves\[0\]: 'nope/\*' names no stack"):
        wave_members("r", names, Strategy(waves=[{"targets": ["nope/*"]}]))
    with pytest.raises(ValidationError, match="write a duration"):
        Strategy(waves=[{"targets": ["x/y"], "bake": "soon"}])


def test_a_rollout_input_places_every_member() -> None:
    member = {"project": "a", "workspace": "w", "spec": {"resources": []}}
    other = {**member, "workspace": "v"}
    SetInput(name="s", members=[member, other], waves=[{"members": [1]}, {"members": [0]}])
    with pytest.raises(ValidationError, match="name every member"):
        SetInput(name="s", members=[member, other], waves=[{"members": [1]}])
    with pytest.raises(ValidationError, match="name every member"):
        SetInput(name="s", members=[member, other], waves=[{"members": [0, 1]}, {"members": [1]}])
    with pytest.raises(ValidationError, match="pause is for sets without waves"):
        SetInput(name="s", members=[member], waves=[{"members": [0]}], on_failure="pause")


def test_a_set_status_stays_bounded() -> None:
    from stackflow.model.stack_set import MEMBER_LIMIT
    from stackflow.temporal.stack_set import (
        ERROR_LIMIT,
        RUNS_KEPT,
        UNKNOWN_LIMIT,
        MemberView,
        SetView,
    )

    longest = "x" * 200
    member = MemberView(
        project=longest,
        workspace=longest,
        counts={"Create": 1, "Update": 1, "Delete": 1, "UnChanged": 1},
        unknown=["u" * ERROR_LIMIT] * UNKNOWN_LIMIT,
        unknown_count=10**6,
        workflow_id="w" * 420,
        runs=["r" * 36] * RUNS_KEPT,
        error="e" * ERROR_LIMIT,
        error_type="StackLocked",
    )
    view = SetView(name=longest, operation="apply", members=[member] * MEMBER_LIMIT)
    assert len(view.model_dump_json()) < 1024 * 1024
