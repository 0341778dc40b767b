"""applies_unchanged: when a server-side apply would change nothing, decided without the
dry run; anything it cannot decide without the schema is left to the dry run (False)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stackflow.runtimes.kubernetes.unchanged import applies_unchanged

Obj = dict[str, Any]

DESIRED: Obj = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "c", "namespace": "n", "labels": {"app": "x"}},
    "data": {"k": "v", "n": "1"},
}
FIELDS: Obj = {"f:data": {"f:k": {}, "f:n": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}


def live(fields: Obj | None = None, **changes: Any) -> Obj:
    """The object as the server holds it after stackflow's apply of DESIRED."""
    obj = copy.deepcopy(DESIRED)
    obj["metadata"].update(
        uid="u",
        resourceVersion="7",
        labels={"app": "x", "team": "theirs"},  # another manager's label
        managedFields=[
            {
                "manager": "stackflow",
                "operation": "Apply",
                "apiVersion": "v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": FIELDS if fields is None else fields,
            },
            {"manager": "kubectl", "operation": "Update", "apiVersion": "v1"},
        ],
    )
    obj.update(changes)
    return obj


def test_an_object_as_the_apply_left_it_is_unchanged() -> None:
    assert applies_unchanged(DESIRED, live())
    with_int = {**DESIRED, "replicas": 1}
    assert applies_unchanged(with_int, live(fields={**FIELDS, "f:replicas": {}}, replicas=1))


@pytest.mark.parametrize(
    ("what", "desired", "obj"),
    [
        ("a value changed", {**DESIRED, "data": {"k": "w", "n": "1"}}, live()),
        ("a field added", {**DESIRED, "data": {"k": "v", "n": "1", "m": "2"}}, live()),
        ("a field dropped (the apply removes it)", {**DESIRED, "data": {"k": "v"}}, live()),
        (
            "another JSON type, an equal value",
            {**DESIRED, "replicas": 1},
            live(fields={**FIELDS, "f:replicas": {}}, replicas=True),
        ),
        ("a list the entry does not show", {**DESIRED, "list": ["a"]}, live(list=["a"])),
        ("a null", {**DESIRED, "extra": None}, live(extra=None)),
        ("a status", {**DESIRED, "status": {}}, live(status={})),
        (
            "metadata other than labels and annotations",
            {**DESIRED, "metadata": {**DESIRED["metadata"], "finalizers": ["f"]}},
            live(),
        ),
        (
            "an atomic map holding more (replaced whole)",
            DESIRED,
            live(fields={**FIELDS, "f:data": {}}, data={"k": "v", "n": "1", "x": "y"}),
        ),
        ("a field owned but not configured", DESIRED, live(fields={**FIELDS, "f:x": {}})),
        ("an empty map over a full one", {**DESIRED, "data": {}}, live()),
        ("not served at this version", {**DESIRED, "apiVersion": "v2"}, live()),
    ],
)
def test_what_the_dry_run_must_decide(what: str, desired: Obj, obj: Obj) -> None:
    assert not applies_unchanged(desired, obj), what


def test_entries_that_do_not_decide_it() -> None:
    deleting = live()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    assert not applies_unchanged(DESIRED, deleting)
    no_entry = live()
    no_entry["metadata"]["managedFields"] = no_entry["metadata"]["managedFields"][1:]
    assert not applies_unchanged(DESIRED, no_entry)
    two = live()
    two["metadata"]["managedFields"].append(dict(two["metadata"]["managedFields"][0]))
    assert not applies_unchanged(DESIRED, two)
    status_entry = live()
    status_entry["metadata"]["managedFields"][0]["subresource"] = "status"
    assert not applies_unchanged(DESIRED, status_entry)
    assert not applies_unchanged(DESIRED, {"metadata": None})


PORTS: Obj = {  # a list of items by key, the key's protocol defaulted by the server
    'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}},
    'k:{"containerPort":81,"protocol":"TCP"}': {".": {}, "f:containerPort": {}},
}


def lists(ports: list[Obj], args: list[Any], held_ports: list[Obj], held_args: list[Any]) -> bool:
    desired = {**DESIRED, "ports": ports, "args": args, "tags": ["a", "b"]}
    fields = {**FIELDS, "f:ports": PORTS, "f:args": {}, "f:tags": {'v:"a"': {}, 'v:"b"': {}}}
    return applies_unchanged(
        desired, live(fields, ports=held_ports, args=held_args, tags=["a", "b"])
    )


def test_lists_read_as_the_entry_reads_them() -> None:
    ports = [{"containerPort": 80}, {"containerPort": 81}]
    held = [{"containerPort": p, "protocol": "TCP"} for p in (80, 81)]
    assert lists(ports, ["x", 1], held, ["x", 1])
    assert not lists(ports, ["x", 1], held, ["x", 2])  # an atomic list changed
    assert not lists(ports, ["x", 1], held, ["x", 1, 2])
    assert not lists(ports, ["x", 1], held[::-1], ["x", 1])  # another order
    assert not lists(ports, ["x", 1], [*held, {"containerPort": 82}], ["x", 1])
    assert not lists(ports[:1], ["x", 1], held[:1], ["x", 1])  # an owned item dropped
    udp = [held[0], {"containerPort": 81, "protocol": "UDP"}]
    assert not lists(ports, ["x", 1], udp, ["x", 1])  # another item by its key
    assert not lists([{"containerPort": 80}, {"containerPort": "81"}], ["x", 1], held, ["x", 1])
