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
        ("a list (merge type unknown)", {**DESIRED, "list": ["a"]}, live(list=["a"])),
        ("a null", {**DESIRED, "extra": None}, live(extra=None)),
        ("a status", {**DESIRED, "status": {}}, live(status={})),
        (
            "metadata other than labels and annotations",
            {**DESIRED, "metadata": {**DESIRED["metadata"], "finalizers": ["f"]}},
            live(),
        ),
        ("an atomic map (owned whole)", DESIRED, live(fields={**FIELDS, "f:data": {}})),
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
