"""The client's light types against what the engine and the server hold: the one place the
values a client needs (phases, event types, limits) are checked equal to the engine's, so the
client imports neither the engine nor the server; the server answers with these types."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from stackflow.api import models
from stackflow.client import types


def test_the_engine_s_values_are_the_client_s() -> None:
    from stackflow.cli.plain_render import ACTIONS
    from stackflow.engine.diff import Action
    from stackflow.engine.spec import MAX_SPEC_BYTES
    from stackflow.model.events import STREAM_NAME, STREAM_VERSION, EventType
    from stackflow.model.release import Phase
    from stackflow.model.source import SourceMode
    from stackflow.temporal.operation import REVISION_LIMIT

    assert tuple(p.value for p in Phase) == types.PHASES
    assert tuple(t.value for t in EventType) == types.EVENT_TYPES
    assert tuple(a.value for a in Action) == ACTIONS
    assert tuple(m.value for m in SourceMode) == types.SOURCE_MODES
    assert (STREAM_NAME, STREAM_VERSION) == (types.STREAM_NAME, types.STREAM_VERSION)
    assert MAX_SPEC_BYTES == types.MAX_SPEC_BYTES
    assert REVISION_LIMIT == types.REVISION_LIMIT


ANSWERS = [
    types.RunCreated,
    types.StepResult,
    types.RunView,
    types.RunSummary,
    types.RunPage,
    types.Health,
    types.PolicyView,
    types.SourceView,
    types.NotificationTargetView,
]


@pytest.mark.parametrize("record", ANSWERS, ids=lambda c: c.__name__)
def test_what_the_server_writes_of_a_record_reads_back_as_the_record(record: Any) -> None:
    """The server answers with the client's records (their response models:
    :func:`stackflow.api.models.answer`): a record, written as a route's answer is, reads
    back equal; a value outside a field's CHOICES is refused by the server too."""
    fields = dict(types.fields_of(record))
    sample = {name: _sample(kind, record.CHOICES.get(name)) for name, kind in fields.items()}
    sent = types.parse(record, sample)
    model = models.answer(record)
    assert model is getattr(models, record.__name__)
    assert list(model.model_fields) == list(fields)
    written = model.model_validate(sent).model_dump(mode="json")
    assert types.parse(record, written) == sent
    assert types.parse(record, types.to_json(sent)) == sent
    for name in record.CHOICES:
        with pytest.raises(ValidationError, match=name):
            model.model_validate({**sample, name: "dancing"})


def _sample(kind: str, choices: tuple[str, ...] | None) -> Any:
    if choices:
        return choices[-1]
    kind = kind.removesuffix(" | None")
    samples: dict[str, Any] = {
        "datetime": datetime(2025, 1, 2, 3, 4, 5).isoformat() + "+00:00",
        "list[RunSummary]": [
            {"run_id": "r", "workflow_id": "w", "operation": "apply", "status": "running"}
        ],
        "list[str]": ["a"],
        "bool": True,
        "int": 3,
        "float": 1.5,
        "str": "x",
    }
    return samples.get(kind, {"k": "v"})


def test_the_operations_and_what_each_takes_are_the_client_s() -> None:
    assert models.RunOperation is types.RunOperation and models.TAKES is types.TAKES
    request_fields = set(models.RunRequest.model_fields) - {"operation", "message"}
    assert set().union(*types.TAKES.values()) <= request_fields


def test_a_run_s_result_through_the_api_is_the_operation_result_s_json() -> None:
    from stackflow.cli.report import result_data
    from stackflow.temporal.operation import OperationResult

    view = types.RunView(
        run_id="r",
        workflow_id="w",
        operation="apply",
        status="completed",
        phase="succeeded",
        revision=2,
    )
    data = result_data(types.Stack("p", "w"), view, {"changes": []}, [], None)
    assert list(OperationResult.model_validate(data).model_dump(mode="json")) == list(data)


def test_the_validator_names_what_is_wrong() -> None:
    with pytest.raises(types.Invalid, match=r"runs.0.status: Field required"):
        types.parse(
            types.RunPage, {"runs": [{"run_id": "r", "workflow_id": "w", "operation": "a"}]}
        )
    with pytest.raises(types.Invalid, match=r"phase: not one of"):
        types.parse(
            types.RunView,
            {
                "run_id": "r",
                "workflow_id": "w",
                "operation": "a",
                "status": "s",
                "phase": "dancing",
            },
        )
    with pytest.raises(types.Invalid, match=r"total: not a number"):
        types.parse(
            types.RunView,
            {"run_id": "r", "workflow_id": "w", "operation": "a", "status": "s", "total": True},
        )
