"""Preview diffs kept in the state backend: indexes stand for many refs, readers expand them."""

from __future__ import annotations

import pytest

from stackflow.core.errors import SpecError
from stackflow.engine.diff import Action, Change, FieldChange
from stackflow.state.backend import StateBackend
from stackflow.state.diff_store import load_changes, put_changes, put_index


def test_indexes_expand_in_order_however_deep(backend: StateBackend) -> None:
    refs = [
        put_changes(backend, [Change(id=f"r{i}", type="t", action=Action.Create)]) for i in range(5)
    ]
    inner = put_index(backend, refs[1:3])
    outer = put_index(backend, [refs[0], inner])
    changes = load_changes(backend, [outer, refs[3], put_index(backend, [refs[4]])])
    assert [c["id"] for c in changes] == ["r0", "r1", "r2", "r3", "r4"]
    assert load_changes(backend, []) == []
    with pytest.raises(SpecError, match="not found"):
        load_changes(backend, [put_index(backend, ["sha256:" + "0" * 64])])


def test_a_change_is_kept_as_its_json_and_adoption_is_not(backend: StateBackend) -> None:
    change = Change(
        id="a",
        type="t",
        action=Action.Update,
        diff=[FieldChange(path="x", old=1, new=2)],
        unrecorded=True,
    )
    (kept,) = load_changes(backend, [put_changes(backend, [change])])
    assert kept == {
        "id": "a",
        "type": "t",
        "action": "Update",
        "drift": False,
        "diff": [{"path": "x", "old": 1, "new": 2}],
    }
