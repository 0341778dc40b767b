"""Property tests of the diff."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stackflow.engine.diff import Action, diff_resource

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=15,
)
objects = st.dictionaries(st.text(min_size=1, max_size=4), json_values, max_size=5)


@settings(max_examples=200, deadline=None)
@given(objects)
def test_object_against_itself_is_unchanged(obj: dict[str, Any]) -> None:
    change = diff_resource("r", "OnPrem", obj, obj, obj)
    assert change.action is Action.UnChanged and change.diff == [] and not change.drift


@settings(max_examples=200, deadline=None)
@given(objects, objects)
def test_live_with_extra_fields_is_unchanged(obj: dict[str, Any], extra: dict[str, Any]) -> None:
    live = {**extra, **obj}  # the live object carries unmanaged fields too
    assert diff_resource("r", "OnPrem", obj, live, None).action is Action.UnChanged


@settings(max_examples=200, deadline=None)
@given(objects)
def test_add_then_remove(obj: dict[str, Any]) -> None:
    created = diff_resource("r", "OnPrem", obj, None, None)
    assert created.action is Action.Create
    assert all(f.old is None for f in created.diff)
    deleted = diff_resource("r", "OnPrem", None, obj, obj)
    assert deleted.action is Action.Delete
    assert all(f.new is None for f in deleted.diff)
    assert [f.path for f in created.diff] == [f.path for f in deleted.diff]


@settings(max_examples=200, deadline=None)
@given(objects, objects)
def test_update_diff_is_nonempty_iff_different(
    desired: dict[str, Any], live: dict[str, Any]
) -> None:
    change = diff_resource("r", "OnPrem", desired, live, None)
    from stackflow.engine.diff import project

    assert (change.action is Action.UnChanged) == (project(live, desired) == desired)
    assert (change.action is Action.Update) == bool(change.diff)
