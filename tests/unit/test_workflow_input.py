"""The one check of what a workflow run or an update is given (``checked_input``): a valid
input comes back as its model; anything else is one non-retryable ``InvalidInput`` line
naming the field, bounded in length, that never quotes a spec or a huge value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.exceptions import ApplicationError

from stackflow.temporal.operation import (
    ApprovalInput,
    BatchInput,
    DriftInput,
    OperationInput,
)
from stackflow.workflows.common import INVALID_INPUT, LINE_LIMIT, checked_input


def refused(model: type[Any], *args: object, **kw: Any) -> str:
    """The error line ``checked_input`` raises for ``args`` (and that it is one)."""
    with pytest.raises(ApplicationError) as caught:
        checked_input(model, args, **kw)
    err = caught.value
    assert err.type == INVALID_INPUT and err.non_retryable
    assert err.__cause__ is None  # the pydantic error (with the input in it) stays here
    line = err.message
    assert "\n" not in line and len(line) <= LINE_LIMIT, line
    return line


def test_a_valid_input_is_its_model() -> None:
    raw = {"project": "demo", "workspace": "dev", "spec": {"resources": []}, "auto_approve": True}
    request = checked_input(OperationInput, (raw,))
    assert request == OperationInput.model_validate(raw)
    same = OperationInput(project="demo")
    assert checked_input(OperationInput, (same,)) is same
    assert checked_input(DriftInput, ({"project": "p", "repair": True},)).repair


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"project": 5},
            "invalid workflow input: project: Input should be a valid string (got 5)",
        ),
        ({"workspace": "dev"}, "invalid workflow input: project: Field required"),
        (
            {"project": "p", "spec": "not a dict"},
            "invalid workflow input: spec: Input should be a valid dictionary "
            "(got a string (10 characters))",
        ),
        (
            {"project": "p", "spec": [1, 2]},
            "invalid workflow input: spec: Input should be a valid dictionary "
            "(got a list of 2 items)",
        ),
        (
            {"project": "p", "worksapce": "dev"},
            "invalid workflow input: worksapce: unknown field (did you mean workspace?) "
            "(got a string (3 characters))",
        ),
        (
            {"project": "p", "max_concurrency": 0},
            "invalid workflow input: max_concurrency: Input should be greater than or equal "
            "to 1 (got 0)",
        ),
        (
            {"project": "p", "auto_approve": "maybe"},
            "invalid workflow input: auto_approve: Input should be a valid boolean, unable to "
            'interpret input (got "maybe")',
        ),
        (
            {"project": "p", "targets": ["ok", 7]},
            "invalid workflow input: targets[1]: Input should be a valid string (got 7)",
        ),
        (
            {"project": "p", "spec": {}, "spec_ref": "sha256:" + "0" * 64},
            "invalid workflow input: give one of spec, spec_ref and source, not more",
        ),
        (
            {"project": "p", "spec_ref": "latest"},
            "invalid workflow input: spec_ref: String should match pattern "
            "'^sha256:[0-9a-f]{64}$' (got \"latest\")",
        ),
        (
            {"project": "p", "on_failure": "retry"},
            "invalid workflow input: on_failure: Input should be 'fail' or 'pause' (got \"retry\")",
        ),
        (
            {"project": "bad name"},
            "invalid workflow input: project: String should match pattern "
            "'^[A-Za-z0-9][A-Za-z0-9._-]*$' (got \"bad name\")",
        ),
        (
            {"project": "p", "approval_timeout_seconds": float("inf")},
            "invalid workflow input: approval_timeout_seconds: Input should be less than or "
            "equal to 315360000 (got Infinity)",
        ),
        (
            {"project": "p", "to_revision": 2**40},
            "invalid workflow input: to_revision: Input should be less than or equal to "
            "2147483647 (got 1099511627776)",
        ),
    ],
)
def test_one_line_names_the_field(raw: dict[str, Any], expected: str) -> None:
    assert refused(OperationInput, raw) == expected


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ([1, 2], "a list of 2 items"),
        ("apply please", "a string (12 characters)"),
        (None, "null"),
        (5, "a number"),
        (True, "a boolean"),
        (b"\x00\x01", "2 bytes"),
    ],
)
def test_an_input_that_is_not_an_object(raw: object, kind: str) -> None:
    assert refused(OperationInput, raw) == (
        "invalid workflow input: expected a JSON object (project, workspace, spec, "
        f"spec_ref, …), got {kind}"
    )


def test_one_argument_exactly() -> None:
    none = refused(OperationInput)
    assert none.endswith("got 0")
    two = refused(OperationInput, {"project": "p"}, {"project": "q"})
    assert two.startswith("invalid workflow input: expected one argument") and two.endswith("got 2")


def test_huge_values_are_never_echoed() -> None:
    huge = "a" * 100_000
    line = refused(OperationInput, {"project": huge})
    assert line.startswith("invalid workflow input: project: String should have at most 200")
    assert '"' + "a" * 40 + '"… (100000 characters)' in line
    # a huge unknown key, and a huge value under it
    line = refused(OperationInput, {"project": "p", huge: huge})
    assert "(100000 characters)" in line and "unknown field" in line
    assert line.count("a" * 41) == 0
    line = refused(OperationInput, {"project": "p", "max_concurrency": 10**5000})
    assert line.endswith("(got a very large number)")
    line = refused(OperationInput, {"project": "p", "ignore_fields": ["x"] * 100_000})
    assert line == (
        "invalid workflow input: ignore_fields: List should have at most 1000 items after "
        "validation, not 100000 (got a list of 100000 items)"
    )
    line = refused(OperationInput, {"project": "p", "targets": ["web", "*" * 100_000]})
    assert line.startswith("invalid workflow input: targets[1]: String should have at most 1000")
    assert line.endswith('"' + "*" * 40 + '"… (100000 characters))')


def test_a_spec_is_never_quoted() -> None:
    secret = "password: hunter2"
    line = refused(OperationInput, {"project": "p", "spec": secret})
    assert "hunter2" not in line and line.endswith("(got a string (17 characters))")
    # nor the value of a field the input does not have (it may be a misnamed spec)
    line = refused(OperationInput, {"project": "p", "specs": secret})
    assert "hunter2" not in line and "specs: unknown field (did you mean spec?)" in line


def test_more_errors_are_counted() -> None:
    line = refused(OperationInput, {"project": 5, "workspace": 6, "watch": "x"})
    assert line.startswith("invalid workflow input: project: Input should be a valid string")
    assert line.endswith("; and 2 more errors")


def test_keys_that_are_not_printable_stay_on_one_line() -> None:
    line = refused(OperationInput, {"project": "p", "a\nb": 1})
    assert line == 'invalid workflow input: "a\\nb": unknown field (got 1)'


def test_other_models() -> None:
    assert (
        refused(DriftInput, {"project": "p", "spec": {}})
        == "invalid workflow input: spec: unknown field (got an object with 0 keys)"
    )
    assert refused(BatchInput, {"project": "p"}).startswith(
        "invalid workflow input: workspace: Field required; and "
    )


def test_updates_take_no_argument_or_one_object() -> None:
    empty = ApprovalInput()
    assert checked_input(ApprovalInput, (), what="update input", empty=empty) is empty
    by = checked_input(ApprovalInput, ({"by": "ann"},), what="update input", empty=empty)
    assert by.by == "ann"
    assert (
        refused(ApprovalInput, {"by": 5}, what="update input", empty=empty)
        == "invalid update input: by: Input should be a valid string (got 5)"
    )
    assert refused(ApprovalInput, "alice", what="update input", empty=empty) == (
        "invalid update input: expected a JSON object (by, reason), got a string (5 characters)"
    )


scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=300)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=30), children, max_size=4)
    ),
    max_leaves=20,
)
fields = st.sampled_from([*OperationInput.model_fields, "other", ""])
inputs = json_values | st.dictionaries(fields, json_values, max_size=6)


@settings(max_examples=500, deadline=None)
@given(st.lists(inputs, max_size=3))
def test_any_json_is_a_model_or_one_invalid_input_line(args: list[Any]) -> None:
    """Whatever a client sends, the check returns the model or raises the one error: never
    another exception (that would fail the workflow task, retried forever)."""
    try:
        request = checked_input(OperationInput, tuple(args))
    except ApplicationError as err:
        assert err.type == INVALID_INPUT and err.non_retryable
        assert "\n" not in err.message and len(err.message) <= LINE_LIMIT
    else:
        assert isinstance(request, OperationInput)
