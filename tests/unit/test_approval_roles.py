"""What only an approver may ask of a run (the API's ``check_role``) and which resources take
over objects stackflow did not make (:mod:`stackflow.engine.takeover`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stackflow.api.identity import Role
from stackflow.api.models import RunOperation, RunRequest
from stackflow.api.problems import Problem
from stackflow.api.runs import check_role, parse_body_spec
from stackflow.core.refs import StackRef
from stackflow.engine.takeover import takes_over, taking_over
from stackflow.model.spec import Resource

STACK = StackRef("payments", "prod")
FILE = {
    "id": "onprem:File:/tmp/a",
    "type": "OnPrem",
    "attributes": {"kind": "File", "path": "/tmp/a", "content": "a"},
}
ADOPTS = {
    "id": "v1:ConfigMap:default:theirs",
    "type": "Kubernetes",
    "attributes": {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "theirs", "namespace": "default"},
    },
    "extensions": {"adopt": True},
}
IMPORTS = {
    "id": "hashicorp:random:random_password:pw",
    "type": "Terraform",
    "attributes": {"length": 8},
    "extensions": {
        "provider": "registry.terraform.io/hashicorp/random/3.6.0",
        "resourceType": "random_password",
        "kusionstack.io/import-id": "legacy",
    },
}


def resource(data: dict[str, Any], **extensions: Any) -> Resource:
    merged = {**data, "extensions": {**data.get("extensions", {}), **extensions}}
    return Resource.model_validate(merged)


def test_which_resources_take_over_objects() -> None:
    assert takes_over(resource(FILE)) is None
    assert takes_over(resource(ADOPTS, adopt=False)) is None
    assert takes_over(resource(IMPORTS, **{"kusionstack.io/import-id": ""})) is None
    assert "extensions.adopt" in (takes_over(resource(ADOPTS)) or "")
    assert "kusionstack.io/import-id" in (takes_over(resource(IMPORTS)) or "")
    found = taking_over([resource(FILE), resource(IMPORTS), resource(ADOPTS)])
    assert [rid for rid, _ in found] == [IMPORTS["id"], ADOPTS["id"]]


def test_each_runtime_s_rules_say_what_takes_over() -> None:
    """The core names no runtime's extension: an ``adopt`` means something to Kubernetes
    only, and an import id to Terraform only, as each one's rules declare."""
    assert takes_over(resource(FILE, adopt=True)) is None
    assert takes_over(resource(FILE, **{"kusionstack.io/import-id": "x"})) is None
    assert takes_over(resource(ADOPTS, **{"kusionstack.io/import-id": "x"})) is not None
    assert "adopt" not in (takes_over(resource(IMPORTS, adopt=True)) or "")


def check(body: dict[str, Any], role: Role) -> None:
    request = RunRequest.model_validate(body)
    check_role(STACK, request, parse_body_spec(request), "carol", role)


@pytest.mark.parametrize(
    "body",
    [
        {"operation": "apply", "spec": {"resources": [FILE]}, "auto_approve": True},
        {"operation": "destroy", "auto_approve": True},
        {"operation": "rollback", "to_revision": 1, "auto_approve": True},
        {"operation": "refresh", "auto_approve": True},
        {"operation": "drift", "repair": True, "auto_approve": True},
    ],
)
def test_auto_approve_is_an_approvers(body: dict[str, Any]) -> None:
    check(body, Role.approver)
    with pytest.raises(Problem) as refused:
        check(body, Role.operator)
    assert refused.value.status == 403
    assert refused.value.detail.startswith(
        "auto_approve: carol is operator on project payments; approving a run up front needs "
        "approver"
    )


@pytest.mark.parametrize("taker", [ADOPTS, IMPORTS])
def test_applying_a_spec_that_takes_over_objects_is_an_approvers(taker: dict[str, Any]) -> None:
    twin = copy.deepcopy(taker)
    twin["id"] += "2"
    if "metadata" in twin["attributes"]:
        twin["attributes"]["metadata"]["name"] += "2"
    body = {"operation": "apply", "spec": {"resources": [FILE, taker, twin]}}
    check(body, Role.approver)
    check({**body, "operation": RunOperation.preview}, Role.operator)  # a preview shows it
    check({"operation": "apply", "spec": {"resources": [FILE]}}, Role.operator)
    with pytest.raises(Problem) as refused:
        check(body, Role.operator)
    problem = refused.value
    assert problem.status == 403 and problem.extra == {"resource": taker["id"]}
    assert problem.detail.startswith(f"resource {taker['id']} ")
    assert "(and 1 more): carol is operator on project payments" in problem.detail
