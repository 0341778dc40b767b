"""Derived sensitivity (what a runtime computes for a resource given a secret is a secret
unless it is a plain copy of a non-sensitive input), the equal-value rule (a known secret is
masked wherever it turns up), and how Terraform is handed sensitive values."""

from __future__ import annotations

import base64
import json
from typing import Any

from stackflow.activities import WorkerActivities
from stackflow.activities.resource_step import sensitive_record
from stackflow.core.crypto import KeyRing
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.masking import (
    MIN_SECRET_LENGTH,
    RECORDED_SENSITIVE_KEY,
    SENSITIVE_MARKER,
    SecretSet,
    derived_sensitive_paths,
    equal_value_paths,
    mask_attributes,
    mask_recorded,
    recorded_sensitive,
    release_sensitive_paths,
    sensitive_values,
)
from stackflow.model.release import Phase
from stackflow.model.spec import Resource
from stackflow.runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.runtimes.terraform.config import parse_resource, render_module, render_variables
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.state.sealing import Sealer
from stackflow.temporal.activity_io import NodeInput, PrepareInput
from stackflow.temporal.operation import OperationInput

PASSWORD = "hunter2-but-longer-Zq9"


def test_terraform_data_output_of_a_tainted_input_is_derived() -> None:
    desired = {"input": PASSWORD}
    live = {"id": "6f1c-uuid", "input": PASSWORD, "output": PASSWORD, "triggers_replace": None}
    assert derived_sensitive_paths(desired, live, ["input"]) == ["id", "input", "output"]


def test_nothing_is_derived_without_a_sensitive_input() -> None:
    desired = {"input": "plain"}
    live = {"id": "x", "input": "plain", "output": "plain"}
    assert derived_sensitive_paths(desired, live, []) == []


def test_plain_copies_of_non_sensitive_inputs_stay_clear_field_by_field() -> None:
    desired = {
        "metadata": {"name": "cm", "labels": {"app": "web"}},
        "data": {"user": "admin", "password": PASSWORD},
    }
    live = {
        "metadata": {
            "name": "cm",
            "labels": {"app": "web"},
            "uid": "1234-abcd",
            "resourceVersion": "77",
        },
        "data": {"user": "admin", "password": PASSWORD},
        "status": {"phase": None},
        "_stackflow_tfstate": "{...}",
    }
    found = derived_sensitive_paths(desired, live, ["data.password"])
    assert found == ["data.password", "metadata.resourceVersion", "metadata.uid"]


def test_a_changed_copy_and_list_items_beyond_the_input_are_derived() -> None:
    desired = {"args": ["a", "b"], "name": "web"}
    live = {"args": ["a", "b", "c"], "name": "web-7f3a"}
    assert derived_sensitive_paths(desired, live, ["secret"]) == ["args[2]", "name"]


def test_placeholders_carry_nothing() -> None:
    desired = {"input": PASSWORD}
    would_be = {"input": PASSWORD, "output": "(known after apply)", "id": "(known after apply)"}
    found = derived_sensitive_paths(
        desired, would_be, ["input"], placeholders=("(known after apply)",)
    )
    assert found == ["input"]


def test_known_values_include_base64_and_skip_short_ones() -> None:
    attrs = {"result": PASSWORD, "pin": "1234", "nested": {"k": 1234567}, "_stackflow_x": "zzzzzzz"}
    found = sensitive_values(attrs, ["result", "pin", "nested", "_stackflow_x"])
    assert PASSWORD in found
    assert base64.b64encode(PASSWORD.encode()).decode() in found
    assert "1234" not in found  # shorter than MIN_SECRET_LENGTH
    assert "1234567" in found
    assert "zzzzzzz" not in found
    assert MIN_SECRET_LENGTH == 6


def test_equal_values_are_found_wherever_they_turn_up() -> None:
    secrets = sensitive_values({"result": PASSWORD, "short": "abc"}, ["result", "short"])
    live = {
        "spec": {"containers": [{"env": [{"value": PASSWORD}, {"value": "abc"}]}]},
        "encoded": base64.b64encode(PASSWORD.encode()).decode(),
        "note": f"contains {PASSWORD} but is not equal",
        "_stackflow_tfstate": PASSWORD,
    }
    assert equal_value_paths(live, secrets) == ["encoded", "spec.containers[0].env[0].value"]


def test_sensitive_record_marks_derived_and_equal_values_so_masking_covers_them() -> None:
    desired = {"input": PASSWORD}
    live = {
        "id": "0d9e2f5a-uuid",
        "input": PASSWORD,
        "output": PASSWORD,
        "_stackflow_sensitive": ["input"],
    }
    marked = sensitive_record("Terraform", desired, live, ["input"], {PASSWORD})
    assert marked == ["id", "input", "output"]
    recorded = {**live, RECORDED_SENSITIVE_KEY: marked}
    shown = mask_attributes("Terraform", recorded)
    assert PASSWORD not in json.dumps(shown)
    assert shown["output"] == SENSITIVE_MARKER


def test_equal_value_rule_without_taint() -> None:
    """A resource that got a secret some other way (the taint was lost) still has it masked."""
    live = {"content": PASSWORD, "path": "/tmp/x", "mode": "0644"}
    desired = dict(live)
    assert sensitive_record("OnPrem", desired, live, [], {PASSWORD}) == ["content"]
    assert sensitive_record("OnPrem", desired, live, [], set()) == []


def test_reported_sensitive_input_argument_derives_the_rest() -> None:
    """An argument the runtime marks sensitive (a schema-sensitive password given in the spec)
    makes the values computed next to it sensitive too; a computed sensitive value does not."""
    desired: dict[str, Any] = {"length": 20}
    live: dict[str, Any] = {
        "length": 20,
        "result": PASSWORD,
        "id": "none",
        "_stackflow_sensitive": ["result"],
    }
    assert sensitive_record("Terraform", desired, live, [], set()) == ["result"]
    desired = {"password": PASSWORD, "name": "db"}
    live = {
        "password": PASSWORD,
        "name": "db",
        "endpoint": "db:5432",
        "_stackflow_sensitive": ["password"],
    }
    assert sensitive_record("Terraform", desired, live, [], set()) == ["endpoint", "password"]


def test_derived_paths_are_sealed_at_rest() -> None:
    keys = KeyRing.parse(f"k1:{base64.b64encode(b'k' * 32).decode()}", "test")
    attributes = {
        "id": "0d9e2f5a-uuid",
        "input": PASSWORD,
        "output": PASSWORD,
        RECORDED_SENSITIVE_KEY: ["id", "input", "output"],
    }
    resource = Resource.model_validate(
        {"id": "builtin:terraform:terraform_data:d", "type": "Terraform", "attributes": attributes}
    )
    sealer = Sealer(keys)
    body = sealer.seal(StackRef("p", "w"), 1, resource)
    assert PASSWORD not in body and "0d9e2f5a" not in body
    assert sealer.open(StackRef("p", "w"), body).attributes == attributes


def _terraform_data(sensitive: list[str]) -> Any:
    return parse_resource(
        ResourceRequest(
            id="builtin:terraform:terraform_data:copy",
            type="Terraform",
            attributes={"input": "${oops}" + PASSWORD, "triggers_replace": ["a", "b"]},
            extensions={"provider": "terraform.io/builtin/terraform"},
            sensitive_paths=sensitive,
        )
    )


def test_terraform_gets_tainted_values_as_sensitive_variables() -> None:
    res = _terraform_data(["input"])
    doc = render_module([res], with_resources=True)
    text = json.dumps(doc)
    assert PASSWORD not in text
    block = doc["resource"]["terraform_data"]["copy"]
    name = block["input"].removeprefix("${var.").removesuffix("}")
    assert doc["variable"] == {name: {"sensitive": True}}
    assert block["triggers_replace"] == ["a", "b"]
    # the value goes to the tfvars file as it is (its strings are literal, not templates)
    assert render_variables([res]) == {name: "${oops}" + PASSWORD}


def test_terraform_without_taint_renders_as_before_and_batches_keep_names_apart() -> None:
    plain = _terraform_data([])
    doc = render_module([plain], with_resources=True)
    assert "variable" not in doc and render_variables([plain]) == {}
    other = parse_resource(
        ResourceRequest(
            id="builtin:terraform:terraform_data:other",
            type="Terraform",
            attributes={"input": {"nested": PASSWORD}},
            extensions={"provider": "terraform.io/builtin/terraform"},
            sensitive_paths=["input.nested"],
        )
    )
    both = render_module(
        [_terraform_data(["input", "triggers_replace[1]"]), other], with_resources=True
    )
    assert len(both["variable"]) == 3
    values = render_variables([_terraform_data(["input", "triggers_replace[1]"]), other])
    assert sorted(values.values(), key=str) == sorted(["${oops}" + PASSWORD, "b", PASSWORD])
    assert PASSWORD not in json.dumps(both)
    # without resource blocks (refresh, destroy) no variable is declared
    assert "variable" not in render_module([other], with_resources=False)


def test_releases_recorded_without_derived_marks_mask_equal_values_when_shown() -> None:
    """A release recorded before derived values were marked: terraform_data.output holds the
    password in its recorded state; release show / output mask it by the equal-value rule."""
    pw = Resource.model_validate(
        {
            "id": "hashicorp:random:random_password:pw",
            "type": "Terraform",
            "attributes": {"length": 22, "result": PASSWORD, RECORDED_SENSITIVE_KEY: ["result"]},
        }
    )
    copy = Resource.model_validate(
        {
            "id": "builtin:terraform:terraform_data:copy",
            "type": "Terraform",
            "attributes": {
                "id": "uuid-1",
                "input": PASSWORD,
                "output": PASSWORD,
                RECORDED_SENSITIVE_KEY: ["input"],
            },
        }
    )
    paths = release_sensitive_paths(None, [pw, copy])
    assert paths[copy.id] >= {"input", "output"} and "id" not in paths[copy.id]
    shown = mask_recorded(copy.attributes, paths[copy.id])
    assert PASSWORD not in json.dumps(shown)
    # sealed values (no keys in this process) are not known secrets: the envelope's key id,
    # path or ciphertext do not mask fields that happen to equal them
    envelope = {"kid": "key-one", "rev": 1, "path": "result", "ct": "c2VhbGVkLXZhbHVl"}
    sealed = pw.model_copy(
        update={"attributes": {"result": {"$sealed": envelope}, RECORDED_SENSITIVE_KEY: ["result"]}}
    )
    plain = Resource.model_validate(
        {
            "id": "onprem:File:/tmp/x",
            "type": "OnPrem",
            "attributes": {"a": "result", "b": "key-one"},
        }
    )
    assert release_sensitive_paths(None, [sealed, plain]).get(plain.id, set()) == set()


def test_a_previews_live_side_keeps_the_specs_own_fields_readable() -> None:
    """The live object's previous value of a field the spec gives (a label being changed) is
    what the preview's diff shows; only fields the spec does not give are derived there."""
    desired = {"metadata": {"labels": {"app": "new"}}, "stringData": {"pw": PASSWORD}}
    live = {
        "metadata": {"labels": {"app": "old"}, "uid": "u-123456"},
        "data": {"pw": "aHVudGVy"},
    }
    inputs = ["stringData"]
    assert derived_sensitive_paths(desired, live, inputs, computed_only=True) == [
        "data",
        "metadata.uid",
    ]
    assert "metadata.labels.app" in derived_sensitive_paths(desired, live, inputs)


def test_secret_sets_look_values_up_without_holding_them() -> None:
    secrets = SecretSet(sensitive_values({"result": PASSWORD}, ["result"]))
    assert PASSWORD in secrets and "other-value" not in secrets
    assert PASSWORD not in repr(vars(secrets))
    joined = secrets | SecretSet(["another-secret"])
    assert len(joined) == 3  # the password, its base64 form, the other one
    live = {"a": "another-secret", "b": PASSWORD, "c": "plain-value"}
    assert equal_value_paths(live, joined) == ["a", "b"]


class _Generating(Runtime):
    """``gen`` generates a secret (marked sensitive, as Terraform marks a password); ``copy``
    hands its input back as a computed ``output``; ``echo`` returns what it was given."""

    type_name = "OnPrem"

    def __init__(self) -> None:
        self.requests: dict[str, ResourceRequest] = {}

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        return None

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        self.requests[resource.id] = resource
        attributes = dict(resource.attributes)
        if resource.id == "gen":
            return {**attributes, "token": PASSWORD, RECORDED_SENSITIVE_KEY: ["token"]}
        if resource.id == "copy":
            return {**attributes, "output": attributes["input"], "id": "copy-7f3a9c"}
        return attributes

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        return None


async def test_apply_records_derived_and_equal_values_of_the_stack(backend: StateBackend) -> None:
    runtime = _Generating()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    acts = WorkerActivities.create(registry, backend, PriorStateCache(None, backend))

    async def apply(run: str, resources: list[dict[str, Any]]) -> int:
        request = OperationInput(project="p", workspace="w", spec={"resources": resources})
        plan = await acts.prepare.prepare_operation(
            PrepareInput(operation="apply", request=request, workflow_id="wf", run_id=run)
        )
        assert plan.revision is not None and plan.spec_ref is not None
        for node in plan.nodes:
            await acts.walk.apply_resource(
                NodeInput(
                    project="p",
                    workspace="w",
                    revision=plan.revision,
                    spec_ref=plan.spec_ref,
                    resource_id=node.id,
                    action="Create",
                    owner=RunRef(workflow_id="wf", run_id=run),
                )
            )
        backend.set_phase(StackRef("p", "w"), plan.revision, Phase.succeeded, run=RunRef("wf", run))
        return plan.revision

    gen = {"id": "gen", "type": "OnPrem", "attributes": {"kind": "File", "path": "/gen"}}
    await apply("r1", [gen])
    copy = {"id": "copy", "type": "OnPrem", "attributes": {"input": "$kusion_path.gen.token"}}
    # a resource that got the secret without a reference (typed in, or a lost taint)
    echo = {"id": "echo", "type": "OnPrem", "attributes": {"note": PASSWORD, "kind": "File"}}
    revision = await apply("r2", [gen, copy, echo])
    assert runtime.requests["copy"].sensitive_paths == ["input"]  # handed to the runtime
    state = backend.get(StackRef("p", "w"), revision).state.by_id()
    assert recorded_sensitive(state["copy"].attributes) == ["id", "input", "output"]
    assert recorded_sensitive(state["echo"].attributes) == ["note"]  # the stack's secret
    for rid in ("copy", "echo"):
        shown = mask_attributes("OnPrem", state[rid].attributes)
        assert PASSWORD not in json.dumps(shown)
    assert state["echo"].attributes["kind"] == "File"
