"""A change as history keeps it (:func:`stackflow.engine.budget.compact_change`): the JSON, key
order included, that preview batches and ``describe_changes`` have always put in history."""

from __future__ import annotations

import json

from stackflow.engine.budget import ENTRIES, VALUE_LIMIT, compact_change
from stackflow.engine.diff import Action, Change, FieldChange


def test_long_values_are_shortened_and_extra_fields_counted() -> None:
    long = "x" * (VALUE_LIMIT + 1)
    change = Change(
        id="a",
        type="t",
        action=Action.Update,
        drift=True,
        diff=[FieldChange(path=f"f{i}", old=long if i == 0 else i, new=None) for i in range(60)],
        unrecorded=True,
    )
    out = compact_change(change)
    assert list(out) == ["id", "type", "action", "drift", "diff", "diff_more"]
    assert out["diff_more"] == 60 - ENTRIES and len(out["diff"]) == ENTRIES
    assert list(out["diff"][1]) == ["path", "old", "new"]
    assert out["diff"][1] == {"path": "f1", "old": 1, "new": None}
    assert out["diff"][0]["old"].startswith("x" * 120 + "…")
    assert f"({VALUE_LIMIT + 1} bytes, sha256:" in out["diff"][0]["old"]
    json.dumps(out)  # plain JSON, as it enters history


def test_a_described_change_says_its_diff_was_omitted_last() -> None:
    change = Change(id="a", type="t", action=Action.Create)
    out = compact_change(change, diff_omitted=True)
    assert json.dumps(out) == (
        '{"id": "a", "type": "t", "action": "Create", "drift": false, "diff": [],'
        ' "diff_omitted": true}'
    )
