"""The pure logic of `stackflow release diff` and `stackflow output ID.path`: what changed
between two releases (spec and state), masked as everywhere else, and one recorded value."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.core.errors import NotFoundError
from stackflow.core.refs import StackRef
from stackflow.engine.masking import (
    SENSITIVE_MARKER,
    mask_attributes,
    mask_recorded,
    release_sensitive_paths,
    sensitive_paths_for,
)
from stackflow.engine.release_diff import (
    FieldChangeKind,
    FieldDiff,
    ResourceChangeKind,
    ResourceDiff,
    diff_releases,
    lookup,
    resolve_resource,
    resource_diff,
    still_sealed,
    walk_path,
)
from stackflow.model.spec import Resource, Spec

PW = "hashicorp:random:random_password:pw"


def res(
    rid: str, rtype: str = "OnPrem", deps: list[str] | None = None, **attributes: Any
) -> Resource:
    return Resource.model_validate(
        {"id": rid, "type": rtype, "attributes": attributes, "dependsOn": deps or []}
    )


def secret(name: str, **data: str) -> Resource:
    return res(
        f"v1:Secret:ns:{name}",
        "Kubernetes",
        apiVersion="v1",
        kind="Secret",
        metadata={"name": name, "namespace": "ns"},
        data=data,
    )


def diff(
    old_spec: list[Resource] | None,
    old_state: list[Resource],
    new_spec: list[Resource] | None,
    new_state: list[Resource],
    *,
    old_context: dict[str, Any] | None = None,
    new_context: dict[str, Any] | None = None,
) -> Any:
    def spec(resources: list[Resource] | None, context: dict[str, Any] | None) -> Spec | None:
        return None if resources is None else Spec(resources=resources, context=context or {})

    return diff_releases(
        StackRef("p", "w"),
        1,
        spec(old_spec, old_context),
        old_state,
        2,
        spec(new_spec, new_context),
        new_state,
    )


def test_added_removed_and_changed_resources_with_their_fields() -> None:
    a1, a2 = res("a", content="one\n", mode="0644"), res("a", content="two\n", mode="0644")
    gone, kept, new = res("gone", content="x"), res("kept", content="k"), res("new", content="n")
    found = diff([a1, gone, kept], [a1, gone, kept], [a2, kept, new], [a2, kept, new])
    for section in (found.spec, found.state):
        assert [(r.id, r.change) for r in section.resources] == [
            ("a", ResourceChangeKind.changed),
            ("gone", ResourceChangeKind.removed),
            ("new", ResourceChangeKind.added),
        ]
        assert section.resources[0].fields == [
            FieldDiff(path="content", kind=FieldChangeKind.changed, old="one\n", new="two\n")
        ]
        assert section.summary == {"added": 1, "removed": 1, "changed": 1, "unchanged": 1}
    assert not found.empty


def test_field_kinds_nested_paths_and_list_items() -> None:
    old = res("svc", ports=[{"port": 80}], labels={"app.kubernetes.io/name": "web", "a": "1"})
    new = res(
        "svc",
        ports=[{"port": 8080}, {"port": 9090}],
        labels={"app.kubernetes.io/name": "web", "b": "2"},
    )
    change = resource_diff(old, new)
    assert change is not None and change.change is ResourceChangeKind.changed
    assert [(f.path, f.kind.value, f.old, f.new) for f in change.fields] == [
        ("labels.a", "removed", "1", None),
        ("labels.b", "added", None, "2"),
        ("ports[0].port", "changed", 80, 8080),
        ("ports[1].port", "added", None, 9090),
    ]
    assert not any(f.sensitive for f in change.fields)


def test_depends_on_extensions_and_type_changes_are_named() -> None:
    old = Resource.model_validate(
        {"id": "x", "type": "OnPrem", "dependsOn": ["a"], "extensions": {"force": False}}
    )
    new = Resource.model_validate(
        {"id": "x", "type": "Kubernetes", "dependsOn": ["b"], "extensions": {"force": True}}
    )
    assert resource_diff(old, new) == ResourceDiff(
        id="x",
        type="Kubernetes",
        change=ResourceChangeKind.changed,
        old_type="OnPrem",
        depends_on_added=["b"],
        depends_on_removed=["a"],
        extensions=[FieldDiff(path="force", kind=FieldChangeKind.changed, old=False, new=True)],
    )
    assert resource_diff(old, old) is None


def test_same_release_twice_is_an_empty_diff() -> None:
    resources = [res("a", content="x"), secret("s", password="aHVudGVy")]
    found = diff(resources, resources, resources, resources)
    assert found.empty and found.spec.resources == [] and found.state.resources == []
    assert found.state.summary == {"added": 0, "removed": 0, "changed": 0, "unchanged": 2}


def test_a_secret_change_says_changed_without_its_values() -> None:
    old, new = (
        secret("db", password="b2xk", user="YWRtaW4="),
        secret("db", password="bmV3", user="YWRtaW4="),
    )
    found = diff([old], [old], [new], [new])
    [change] = found.state.resources
    assert change.fields == [
        FieldDiff(
            path="data.password",
            kind=FieldChangeKind.changed,
            old=SENSITIVE_MARKER,
            new=SENSITIVE_MARKER,
            sensitive=True,
        )
    ]
    text = found.model_dump_json()
    assert "b2xk" not in text and "bmV3" not in text and "YWRtaW4=" not in text
    # unchanged secret values are not reported at all
    same = diff([old], [old], [old], [old])
    assert same.empty


def test_a_value_sensitive_in_one_revision_only_is_masked_on_both_sides() -> None:
    # revision 2's state records `token` as sensitive (a runtime said so); revision 1 did not
    old = res("t", "Terraform", token="plain-before")
    new = res("t", "Terraform", token="secret-after", _stackflow_sensitive=["token"])
    found = diff([res("t", "Terraform")], [old], [res("t", "Terraform")], [new])
    [change] = found.state.resources
    [field] = change.fields  # the private list itself is bookkeeping, not shown
    assert field.path == "token" and field.sensitive
    assert field.old == field.new == SENSITIVE_MARKER
    assert "plain-before" not in found.model_dump_json()


def test_taint_follows_references_and_chains_of_them() -> None:
    pw = res(PW, "Terraform", length=16, result="pw-1", _stackflow_sensitive=["result"])
    pw2 = res(PW, "Terraform", length=16, result="pw-2", _stackflow_sensitive=["result"])
    # `copy` takes the password; `second` takes `copy`'s content: both tainted
    copy_spec = res("copy", content=f"$kusion_path.{PW}.result", banner="hi")
    second_spec = res("second", content="$kusion_path.copy.content")
    spec = [second_spec, copy_spec, pw]  # the chain is found whatever the order
    # states as an older stackflow recorded them: no taint written down
    old_state = [pw, res("copy", content="pw-1", banner="hi"), res("second", content="pw-1")]
    new_state = [pw2, res("copy", content="pw-2", banner="ho"), res("second", content="pw-2")]
    paths = release_sensitive_paths(Spec(resources=spec), old_state)
    assert paths["copy"] >= {"content"} and paths["second"] >= {"content"}
    assert "banner" not in paths["copy"]
    found = diff(spec, old_state, spec, new_state)
    fields = {(r.id, f.path): f for r in found.state.resources for f in r.fields}
    assert fields[("copy", "content")].sensitive
    assert fields[("second", "content")].sensitive
    assert fields[(PW, "result")].old == SENSITIVE_MARKER
    assert fields[("copy", "banner")].old == "hi" and not fields[("copy", "banner")].sensitive
    assert "pw-1" not in found.model_dump_json() and "pw-2" not in found.model_dump_json()


def test_context_env_is_masked_and_other_settings_are_shown() -> None:
    resources = [res("a", content="x")]
    found = diff(
        resources,
        resources,
        resources,
        resources,
        old_context={"env": {"TOKEN": "old-token"}, "kubeContext": "one"},
        new_context={"env": {"TOKEN": "new-token", "MORE": "m0re"}, "kubeContext": "two"},
    )
    assert [(f.path, f.kind.value, f.old, f.new, f.sensitive) for f in found.spec.fields] == [
        ("context.env.MORE", "added", None, SENSITIVE_MARKER, True),
        ("context.env.TOKEN", "changed", SENSITIVE_MARKER, SENSITIVE_MARKER, True),
        ("context.kubeContext", "changed", "one", "two", False),
    ]
    text = found.model_dump_json()
    assert "old-token" not in text and "new-token" not in text and "m0re" not in text


def test_runtime_private_keys_are_not_diffed() -> None:
    old = res("t", "Terraform", length=16, _stackflow_tfstate='{"serial": 1}')
    new = res("t", "Terraform", length=16, _stackflow_tfstate='{"serial": 2}')
    assert resource_diff(old, new, sensitive_paths_for("Terraform", new.attributes)) is None


def sealed(ct: str, path: str = "data") -> dict[str, Any]:
    return {"$sealed": {"kid": "k1", "rev": 1, "path": path, "ct": ct}}


def test_values_still_sealed_compare_by_ciphertext_and_never_show() -> None:
    def sealed_secret(ct: str) -> Resource:
        r = secret("s")
        return r.model_copy(update={"attributes": {**r.attributes, "data": sealed(ct)}})

    same = resource_diff(sealed_secret("Q1Q="), sealed_secret("Q1Q="), ["data"])
    assert same is None
    other = resource_diff(sealed_secret("Q1Q="), sealed_secret("T1RIRVI="), ["data"])
    assert other is not None
    [field] = other.fields
    assert field.path == "data" and field.kind is FieldChangeKind.unknown and field.sensitive
    assert field.old == field.new == SENSITIVE_MARKER
    assert "Q1Q=" not in other.model_dump_json() and "k1" not in other.model_dump_json()
    assert still_sealed({"a": [sealed("x")]}) and not still_sealed({"a": ["x"]})


def test_a_missing_spec_is_not_compared() -> None:
    state = [res("a", content="x")]
    found = diff(None, state, [res("a", content="x")], [res("a", content="y")])
    assert found.spec.missing == [1] and found.spec.resources == []
    assert [r.id for r in found.state.resources] == ["a"]


def test_release_sensitive_paths_agree_with_the_masking_of_recorded_state() -> None:
    state = [
        secret("s", password="cA=="),
        res(PW, "Terraform", result="r", _stackflow_sensitive=["result"], _stackflow_tfstate="{}"),
        res("plain", content="c"),
    ]
    paths = release_sensitive_paths(None, state)
    for r in state:
        assert set(sensitive_paths_for(str(r.type), r.attributes)) == paths[r.id]
        assert mask_recorded(r.attributes, paths[r.id]) == mask_attributes(
            str(r.type), r.attributes
        )


def test_resolve_resource_takes_the_longest_recorded_id() -> None:
    ids = ["a", "a.b", "v1:ConfigMap:ns:cm", "apps/v1:Deployment:ns:web"]
    assert resolve_resource("a.b.c", ids) == ("a.b", "c")
    assert resolve_resource("a.c", ids) == ("a", "c")
    assert resolve_resource("a.b", ids) == ("a.b", "")
    assert resolve_resource("v1:ConfigMap:ns:cm.data.key", ids) == (
        "v1:ConfigMap:ns:cm",
        "data.key",
    )
    assert resolve_resource("apps/v1:Deployment:ns:web[0]", ids) == (
        "apps/v1:Deployment:ns:web",
        "[0]",
    )
    assert resolve_resource("ab", ids) is None
    assert resolve_resource("v1:ConfigMap:ns", ids) is None


def test_walk_path_keys_with_dots_and_list_indexes() -> None:
    value = {
        "metadata": {"labels": {"app.kubernetes.io/name": "web", "app": "x"}},
        "spec": {"ports": [{"port": 80}, {"port": 443}]},
        "data": {"0": "zero"},
    }
    assert walk_path(value, "metadata.labels.app.kubernetes.io/name") == (
        ["metadata", "labels", "app.kubernetes.io/name"],
        "web",
    )
    assert walk_path(value, "metadata.labels.app")[1] == "x"
    assert walk_path(value, "spec.ports.1.port") == (["spec", "ports", 1, "port"], 443)
    assert walk_path(value, "spec.ports[1].port")[1] == 443
    assert walk_path(value, 'metadata.labels["app.kubernetes.io/name"]')[1] == "web"
    assert walk_path(value, "data.0")[1] == "zero"
    assert walk_path(value, "")[1] is value
    from stackflow.core.paths import PathError

    with pytest.raises(PathError, match=r"no field spec\.ports\[2\] \(it has 2 items\)"):
        walk_path(value, "spec.ports.2.port")
    with pytest.raises(PathError, match=r"no field spec\.nope"):
        walk_path(value, "spec.nope")
    with pytest.raises(PathError, match="is a list"):
        walk_path(value, "spec.ports.first")
    with pytest.raises(PathError, match=r"no field spec\.ports\[0\]\.port\.deeper"):
        walk_path(value, "spec.ports.0.port.deeper")


def test_lookup_masks_sensitive_values_unless_asked() -> None:
    state = [
        secret("db", password="aHVudGVy"),
        res("copy", content="hunter"),
        res("v1:ConfigMap:ns:cm", "Kubernetes", kind="ConfigMap", data={"key": "value"}),
    ]
    sensitive = {"v1:Secret:ns:db": {"data", "stringData"}, "copy": {"content"}}
    where = "release 3 of p/w"
    found = lookup("v1:ConfigMap:ns:cm.data.key", state, sensitive, where=where)
    assert (found.id, found.path, found.value, found.sensitive) == (
        "v1:ConfigMap:ns:cm",
        "data.key",
        "value",
        False,
    )
    masked = lookup("v1:Secret:ns:db.data.password", state, sensitive, where=where)
    assert masked.value == SENSITIVE_MARKER and masked.sensitive
    whole = lookup("v1:Secret:ns:db", state, sensitive, where=where)
    assert whole.value["data"] == SENSITIVE_MARKER and whole.value["kind"] == "Secret"
    assert whole.sensitive  # it holds a sensitive value
    assert lookup("copy.content", state, sensitive, where=where).value == SENSITIVE_MARKER
    shown = lookup(
        "v1:Secret:ns:db.data.password", state, sensitive, show_sensitive=True, where=where
    )
    assert shown.value == "aHVudGVy" and shown.sensitive
    with pytest.raises(NotFoundError, match=r"^nope\.x: no such resource in release 3 of p/w$"):
        lookup("nope.x", state, sensitive, where=where)
    with pytest.raises(
        NotFoundError, match=r"^v1:ConfigMap:ns:cm: no field data\.other in release 3 of p/w$"
    ):
        lookup("v1:ConfigMap:ns:cm.data.other", state, sensitive, where=where)
