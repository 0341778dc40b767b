"""StackRef: a stack as one value in code, while what travels, is stored or printed keeps
the fields ``project`` and ``workspace``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from stackflow.core.refs import StackRef
from stackflow.model.release import Phase, Release
from stackflow.temporal.activity_io import NodeInput
from stackflow.temporal.operation import OperationInput, workflow_id_for


def test_a_stack_ref_is_a_frozen_hashable_value() -> None:
    stack = StackRef("shop", "prod")
    assert stack == StackRef(project="shop", workspace="prod") != StackRef("shop", "dev")
    assert {stack: 1}[StackRef("shop", "prod")] == 1
    with pytest.raises(ValidationError):
        stack.project = "other"  # type: ignore[misc]


def test_a_stack_ref_reads_as_messages_ids_and_commands_name_stacks() -> None:
    stack = StackRef("shop", "prod")
    assert str(stack) == f"{stack}" == "shop/prod"
    assert stack.cli_flags == "--project shop --workspace prod"
    assert workflow_id_for(stack) == "stackflow/shop/prod"


def test_wire_models_keep_their_fields_and_name_the_stack_by_a_property() -> None:
    request = OperationInput(project="shop", workspace="prod")
    assert request.stack == StackRef("shop", "prod")
    data = request.model_dump(mode="json")
    assert (data["project"], data["workspace"]) == ("shop", "prod") and "stack" not in data
    node = NodeInput(
        project="shop", workspace="prod", revision=1, spec_ref=None, resource_id="a", action="x"
    )
    assert list(node.model_dump())[:2] == ["project", "workspace"]
    assert node.stack == request.stack


def test_a_release_names_its_stack_by_stack_ref_beside_kusions_stack_field() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    release = Release.model_validate(
        {
            "project": "shop",
            "workspace": "prod",
            "revision": 1,
            "stack": "shop-stack",
            "phase": Phase.succeeded,
            "createTime": at,
            "modifiedTime": at,
        }
    )
    assert release.stack_ref == StackRef("shop", "prod") and release.stack == "shop-stack"
    assert "stack_ref" not in release.model_dump()
