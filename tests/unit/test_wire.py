"""The compact encodings in Temporal history: each round-trips, and each is byte for byte
what runs in flight already hold (the literals below are the format of releases 0.1.x)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stackflow.temporal.activity_io import DescribeInput, PreviewBatchResult
from stackflow.temporal.operation import BatchInput
from stackflow.temporal.wire import (
    ActionCode,
    BatchActions,
    ChangeFlags,
    DescribeItem,
    LineRef,
    decode_changes,
    encode_change,
)

ACTIONS = ["Create", "Update", "Delete", "UnChanged"]


def test_action_codes_are_the_letters_on_the_wire() -> None:
    assert {a: str(ActionCode.of(a)) for a in ACTIONS} == {
        "Create": "C",
        "Update": "U",
        "Delete": "D",
        "UnChanged": "N",
    }
    assert [ActionCode(c).action for c in "CUDN"] == ACTIONS


def test_change_flags_are_the_digits_on_the_wire() -> None:
    assert (int(ChangeFlags.drift), int(ChangeFlags.diff_omitted), int(ChangeFlags.unrecorded)) == (
        1,
        2,
        4,
    )
    assert encode_change("Update", ChangeFlags.drift | ChangeFlags.diff_omitted) == "U3"
    assert encode_change("UnChanged", ChangeFlags.unrecorded) == "N4"
    assert encode_change("Create", ChangeFlags.none) == "C0"


@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7)), max_size=50))
def test_change_codes_round_trip(lines: list[tuple[str, int]]) -> None:
    codes = "".join(encode_change(a, ChangeFlags(f)) for a, f in lines)
    assert len(codes) == 2 * len(lines)
    assert [(c.action, int(f)) for c, f in decode_changes(codes)] == lines


def test_batch_actions_pad_skipped_indices_with_dots() -> None:
    start, actions = BatchActions.encode([(3, "Create"), (4, "Update"), (7, "Delete")])
    assert (start, actions) == (3, "CU..D")
    assert BatchActions.decode(actions) == [
        (0, ActionCode.create),
        (1, ActionCode.update),
        (4, ActionCode.delete),
    ]
    assert BatchActions.indices(start, actions) == [3, 4, 7]
    assert BatchActions.count(actions) == 3


@given(st.dictionaries(st.integers(0, 200), st.sampled_from(ACTIONS), min_size=1, max_size=40))
def test_batch_actions_round_trip(chosen: dict[int, str]) -> None:
    picks = sorted(chosen.items())
    start, actions = BatchActions.encode(picks)
    assert [(start + i, c.action) for i, c in BatchActions.decode(actions)] == picks
    assert BatchActions.indices(start, actions) == [i for i, _ in picks]
    assert BatchActions.count(actions) == len(picks)


def test_batch_input_json_is_unchanged() -> None:
    start, actions = BatchActions.encode([(0, "Create"), (2, "Delete")])
    batch = BatchInput(
        project="p",
        workspace="w",
        revision=1,
        spec_ref=None,
        operation="apply",
        plan_ref="sha256:" + "0" * 64,
        start=start,
        actions=actions,
    )
    assert json.loads(batch.model_dump_json())["actions"] == "C.D"


def test_describe_items_are_lists_on_the_wire_and_come_back_typed() -> None:
    items = [
        DescribeItem.of(LineRef(False, 5), "Update", ChangeFlags.drift, (2, "spec.replicas")),
        DescribeItem.of(LineRef(True, 0), "Delete", ChangeFlags.none, None),
    ]
    request = DescribeInput(plan_ref="sha256:" + "1" * 64, items=items)
    wire = json.loads(request.model_dump_json())["items"]
    assert wire == [["n", 5, "Update", 1, 2, "spec.replicas"], ["d", 0, "Delete", 0, -1, ""]]
    back = DescribeInput.model_validate_json(request.model_dump_json()).items
    assert back == items
    assert [item.line for item in back] == [LineRef(False, 5), LineRef(True, 0)]


def test_a_preview_batch_result_keeps_its_codes_as_one_string() -> None:
    result = PreviewBatchResult(codes=encode_change("Create", ChangeFlags.none) + "N4")
    assert json.loads(result.model_dump_json())["codes"] == "C0N4"


@pytest.mark.parametrize("bad", ["X0", "C"])
def test_a_malformed_code_string_is_refused(bad: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        decode_changes(bad)
