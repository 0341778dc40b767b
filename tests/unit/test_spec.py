"""Spec models and loading: Kusion's shape in, one-line errors out."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stackflow.core.errors import GraphError, SpecError
from stackflow.engine.spec import (
    DuplicateKeyError,
    load_spec,
    load_yaml,
    parse_spec,
    parse_spec_text,
)
from stackflow.model.spec import (
    MAX_RESOURCE_BYTES,
    Resource,
    ResourceType,
    Spec,
    resource_digest,
    spec_digest,
)

SHARED = Path(__file__).resolve().parents[3] / "shared"
KUSION = SHARED / "compat" / "kusion"


def res(rid: str, type_: str = "OnPrem", **extra: object) -> dict[str, object]:
    return {"id": rid, "type": type_, **extra}


def test_kusion_field_names_round_trip() -> None:
    data = {
        "resources": [
            res("v1:Namespace:ns", "Kubernetes", attributes={"kind": "Namespace"}),
            res(
                "apps/v1:Deployment:ns:web",
                "Kubernetes",
                dependsOn=["v1:Namespace:ns"],
                extensions={"GVK": "apps/v1, Kind=Deployment"},
            ),
        ],
        "secretStore": {"provider": {"aws": {"region": "eu-west-1"}}},
        "context": {"k": "v"},
    }
    spec = parse_spec(data)
    assert spec.resources[1].depends_on == ["v1:Namespace:ns"]
    assert spec.secret_store == {"provider": {"aws": {"region": "eu-west-1"}}}
    dumped = spec.model_dump(by_alias=True)
    assert dumped["secretStore"] == data["secretStore"]
    assert dumped["resources"][1]["dependsOn"] == ["v1:Namespace:ns"]
    assert parse_spec(dumped) == spec


def test_populate_by_name() -> None:
    r = Resource(id="x", type=ResourceType.OnPrem, depends_on=["y"])
    assert r.depends_on == ["y"]
    assert Spec(resources=[r], secret_store=None).resources == [r]


def test_kusion_plan_service_resource_loads() -> None:
    resource = yaml.safe_load(
        (KUSION / "runtime/kubernetes/testdata/plan_service.yaml").read_text()
    )
    namespace = res("v1:Namespace:code-city", "Kubernetes")
    spec = parse_spec({"resources": [namespace, resource]})
    assert spec.resources[1].id == "v1:Service:code-city:gocity"
    assert spec.resources[1].attributes["spec"]["ports"][0]["port"] == 4000


def test_kusion_release_spec_loads() -> None:
    data = yaml.safe_load(
        (KUSION / "release/storages/testdata/releases/test_project/test_ws/3.yaml").read_text()
    )
    spec = parse_spec(data["spec"])
    assert spec.secret_store is None and spec.context == {}
    assert spec.resources[0].extensions["GVK"].startswith("apps.kusionstack.io")


def test_nulls_become_empty() -> None:
    spec = parse_spec(
        {"resources": [res("a", attributes=None, dependsOn=None, extensions=None)], "context": None}
    )
    assert spec.resources[0].attributes == {} and spec.resources[0].depends_on == []


@pytest.mark.parametrize(
    ("rid", "type_", "ok"),
    [
        ("apps/v1:Deployment:ns:web", "Kubernetes", True),
        ("v1:Namespace:ns", "Kubernetes", True),  # cluster-scoped
        ("web", "Kubernetes", False),
        ("a:b:c:d:e", "Kubernetes", False),
        ("hashicorp:random:random_password:pw", "Terraform", True),
        ("random_password:pw", "Terraform", False),
        ("anything goes / here", "OnPrem", True),
    ],
)
def test_id_conventions(rid: str, type_: str, ok: bool) -> None:
    data = {"resources": [res(rid, type_)]}
    if ok:
        parse_spec(data)
    else:
        with pytest.raises(SpecError, match=r"resources\[0\] .*: id: a "):
            parse_spec(data)


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ([1, 2], "a spec is a mapping with a 'resources' list, got list"),
        (None, "got nothing"),
        ({"resource": []}, "needs a top-level 'resources' list"),
        ({"resources": {"a": 1}}, "resources: Input should be a valid list"),
        ({"resources": [res("a"), {"id": 5, "type": "OnPrem"}]}, r"resources\[1\]: id: "),
        ({"resources": [res("a", "Foo")]}, r"resources\[0\] \(id 'a'\): type: unknown type 'Foo'"),
        ({"resources": [res("a", depends_on=1)]}, r"resources\[0\] \(id 'a'\): depends_on"),
        ({"resources": [res("a", bogus=1)]}, r"resources\[0\] \(id 'a'\): bogus: unknown field"),
        ({"resources": [res("a", attributes=[1])]}, r"attributes: Input should be a valid dict"),
        ({"resources": [res("")]}, r"resources\[0\] \(id ''\): id: "),
        ({"resources": [], "extra": 1}, "extra: unknown field"),
    ],
)
def test_shape_errors_name_the_place(data: object, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern) as info:
        parse_spec(data, "spec.yaml")
    message = str(info.value)
    assert message.startswith("spec.yaml: ")
    assert "\n" not in message


def test_graph_rules_run_in_parse_spec() -> None:
    with pytest.raises(GraphError, match=r"x\.yaml: .*duplicate"):
        parse_spec({"resources": [res("a"), res("a")]}, "x.yaml")
    with pytest.raises(GraphError, match="dependency cycle: a -> a"):
        parse_spec({"resources": [res("a", dependsOn=["a"])]})


def test_resource_size_limit() -> None:
    big = {"resources": [res("a", attributes={"blob": "x" * (MAX_RESOURCE_BYTES + 1)})]}
    with pytest.raises(SpecError, match=r"resources\[0\] \(id 'a'\): attributes: \d+ bytes"):
        parse_spec(big)
    parse_spec({"resources": [res("a", attributes={"blob": "x" * 1000})]})


def test_yaml_errors_are_one_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec_text("resources: [\n  - id: a\n   type: : x", "bad.yaml")
    assert str(info.value).startswith("bad.yaml: invalid YAML at line")
    assert "\n" not in str(info.value)


def test_json_text_and_timestamps_stay_strings() -> None:
    text = json.dumps({"resources": [res("a", attributes={"when": "2024-05-10T16:48:00+08:00"})]})
    spec = parse_spec_text(text)
    assert spec.resources[0].attributes["when"] == "2024-05-10T16:48:00+08:00"
    spec = parse_spec_text("resources:\n- id: a\n  type: OnPrem\n  attributes: {d: 2024-05-10}\n")
    assert spec.resources[0].attributes["d"] == "2024-05-10"


def test_load_spec_file_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("resources:\n- id: a\n  type: OnPrem\n")
    assert load_spec(path).resources[0].id == "a"
    assert load_spec(str(path)).resources[0].id == "a"
    monkeypatch.setattr("sys.stdin", io.StringIO('{"resources": [{"id": "b", "type": "OnPrem"}]}'))
    assert load_spec("-").resources[0].id == "b"
    with pytest.raises(SpecError, match=r"missing\.yaml: cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_digests_are_canonical() -> None:
    a = parse_spec({"resources": [res("a", attributes={"x": 1, "y": 2})]})
    b = parse_spec({"resources": [res("a", attributes={"y": 2, "x": 1})]})
    c = parse_spec({"resources": [res("a", attributes={"y": 2, "x": 3})]})
    assert spec_digest(a) == spec_digest(b) != spec_digest(c)
    assert resource_digest(a.resources[0]) == resource_digest(b.resources[0])
    assert len(spec_digest(a)) == 64


def test_plain_equals_sign_is_a_string_as_kubectl_reads_it() -> None:
    # a CRD enum as real ones write it; PyYAML's YAML 1.1 'value' tag used to fail on it
    text = (
        "resources:\n- id: a\n  type: OnPrem\n  attributes:\n"
        "    operator: {type: string, enum: [=, '!=', In]}\n    sign: =\n    =: key\n"
    )
    attrs = parse_spec_text(text).resources[0].attributes
    assert attrs["operator"]["enum"] == ["=", "!=", "In"]
    assert attrs["sign"] == "=" and attrs["="] == "key"


@pytest.mark.parametrize(
    ("plain", "value"),
    [
        ("22:22", "22:22"),  # no YAML 1.1 base 60 (PyYAML: 1342), as go-yaml
        ("1:20:30.5", "1:20:30.5"),
        ("0o17", 15),
        ("0755", 493),
        ("0x1F", 31),
        ("-0b101", -5),
        ("1_000", 1000),
        ("+7", 7),
        ("1e3", 1000.0),  # PyYAML: the string '1e3'
        ("1.5E-2", 0.015),
        (".5", 0.5),
        ("-.inf", float("-inf")),
        ("08", 8.0),
        ("0x", "0x"),
        ("1e", "1e"),
        ("123abc", "123abc"),
        ("2024-05-10", "2024-05-10"),
        ("2024-05-10T16:48:00Z", "2024-05-10T16:48:00Z"),
        ("yes", True),
        ("off", False),
        ("y", "y"),  # go-yaml v2 says true (a `y:` key becomes "true"); kept a string here
        ("~", None),
    ],
)
def test_plain_scalars_are_typed_as_kubectl_types_them(plain: str, value: object) -> None:
    got = load_yaml(f"v: {plain}\n")["v"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\nb: 2\na: 3\n", 'line 3: duplicate key "a" (first at line 1)'),
        ("x:\n  y:\n    - {k: 1, k: 2}\n", 'line 3: duplicate key "k" (first at line 3)'),
        ("{1: a, 0x1: b}", "line 1: duplicate key 1 (first at line 1)"),
        ('{"a": {"b": [1, {"c": 1,\n"c": 2}]}}', 'line 2: duplicate key "c" (first at line 1)'),
        ('{\n  "a": 1,\n  "a": 2\n}', 'line 3: duplicate key "a" (first at line 2)'),
        # an explicit key may override a merged one, but not another explicit key
        ("b: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n  x: 3\n", 'line 5: duplicate key "x"'),
    ],
)
def test_duplicate_keys_are_errors_naming_key_and_line(text: str, message: str) -> None:
    with pytest.raises(DuplicateKeyError) as info:
        load_yaml(text)
    assert str(info.value).startswith(message)
    with pytest.raises(DuplicateKeyError):
        load_yaml(text.encode())


def test_merge_keys_still_merge() -> None:
    text = "b: &b {x: 1, y: 2}\nc: &c {x: 9, z: 3}\nm:\n  <<: [*b, *c]\n  y: 5\n"
    assert load_yaml(text)["m"] == {"x": 1, "y": 5, "z": 3}


def test_duplicate_key_in_a_spec_is_one_spec_error_line() -> None:
    text = "resources:\n- id: a\n  type: OnPrem\n  attributes: {mode: '0644', mode: '0600'}\n"
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "spec.yaml")
    assert str(info.value) == 'spec.yaml: line 4: duplicate key "mode" (first at line 4)'


def test_lone_surrogate_escape_in_json_is_refused() -> None:
    text = '{"resources": [{"id": "a", "type": "OnPrem",\n "attributes": {"x": "caf\\udcc3"}}]}'
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "spec.json")
    assert str(info.value) == (
        "spec.json: invalid JSON at line 2: \\udcc3 is half of a UTF-16 surrogate pair, "
        "not a character"
    )
    pair = '{"resources": [{"id": "a", "type": "OnPrem", "attributes": {"x": "\\ud83c\\udf70"}}]}'
    assert parse_spec_text(pair).resources[0].attributes["x"] == "\U0001f370"


def test_non_ascii_stdin_is_read_as_utf8_whatever_the_locale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = "resources:\n- id: v1:ConfigMap:default:café-menü\n  type: Kubernetes\n".encode()
    # what sys.stdin is under LC_ALL=C without UTF-8 mode: ASCII text, surrogate escapes
    stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="ascii", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    assert load_spec("-").resources[0].id == "v1:ConfigMap:default:café-menü"


def _alias_bomb(levels: int) -> str:
    lines = ["resources:", "- id: bomb", "  type: OnPrem", "  attributes:"]
    lines.append("    a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]")
    for i in range(1, levels + 1):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_before_expansion_cheaply() -> None:
    """Nine levels (9^10 strings once expanded) in a child process: its peak memory and the
    parse time are read there, so nothing else in the test process counts."""
    probe = (
        "import resource, sys, time\n"
        "from stackflow.core.errors import SpecError\n"
        "from stackflow.engine.spec import parse_spec_text\n"
        "text = sys.stdin.read()\n"
        "t0 = time.perf_counter()\n"
        "try:\n"
        "    parse_spec_text(text, 'bomb.yaml')\n"
        "except SpecError as err:\n"
        "    print(err)\n"
        "print(time.perf_counter() - t0)\n"
        # VmHWM: this process's own peak. ru_maxrss is not: Linux carries the parent's peak
        # over exec (vfork), so under a big pytest process it read 328-436 MB here.
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "print(int(hwm[0].split()[1]) // 1024 if hwm else "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        input=_alias_bomb(9),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    message, seconds, peak_mb = proc.stdout.splitlines()
    assert message.startswith("bomb.yaml: line 11: excessive aliasing (aliases that expand to")
    assert float(seconds) < 2.0
    assert int(peak_mb) < 200


def test_aliases_within_budget_still_expand() -> None:
    spec = parse_spec_text(_alias_bomb(3))
    assert len(spec.resources[0].attributes["a3"]) == 9
    assert spec.resources[0].attributes["a3"][8][8][8] == ["lol"] * 9


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 513 + "]" * 513,
        "{a: " * 513 + "1" + "}" * 513,
        "".join(f"\n{' ' * (4 + i)}k:" for i in range(513)) + " 1",
        "\n      " + "- " * 513 + "x",
    ],
    ids=["flow-sequences", "flow-mappings", "block-mappings", "compact-sequences"],
)
def test_deep_nesting_is_refused_while_parsing(nested: str) -> None:
    """30,000 levels crashed the interpreter in libyaml's recursive composer: the budget is
    checked on the event stream, before anything is composed."""
    text = "resources:\n- id: deep\n  type: OnPrem\n  attributes:\n    v: " + nested + "\n"
    with pytest.raises(SpecError, match=r"collections nested deeper than 512 levels"):
        parse_spec_text(text, "deep.yaml")
    deeper = text.replace(nested, "[" * 30_000 + "]" * 30_000)
    with pytest.raises(SpecError, match=r"line 5: collections nested deeper than 512 levels"):
        parse_spec_text(deeper, "deep.yaml")


def test_deep_json_is_one_spec_error() -> None:
    text = '{"resources": [{"id": "a", "type": "OnPrem", "attributes": {"v": '
    text += "[" * 30_000 + "]" * 30_000 + "}}]}"
    with pytest.raises(SpecError, match=r"^deep.json: collections nested too deeply for JSON$"):
        parse_spec_text(text, "deep.json")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("attributes: {x: {y: [1, .nan]}}", "attributes.x.y[1]"),
        ("attributes: {x: .inf}", "attributes.x"),
        ("attributes: {}\n  extensions: {z: -.inf}", "extensions.z"),
    ],
)
def test_nan_and_infinity_are_refused_naming_the_field(text: str, where: str) -> None:
    """No JSON value: no runtime, store or history could take one, so it is bad input."""
    spec = f"resources:\n- id: a\n  type: OnPrem\n  {text}\n"
    with pytest.raises(SpecError) as err:
        parse_spec_text(spec, "s.yaml")
    assert str(err.value) == (
        f"s.yaml: resources[0] (id 'a'): {where}: NaN and Infinity are not JSON values; "
        "quote it to pass a string"
    )
    assert parse_spec_text(spec.replace(".nan", "'.nan'").replace(".inf", "'.inf'"), "s.yaml")
