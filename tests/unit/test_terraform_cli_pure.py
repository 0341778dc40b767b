"""Pure parts of the Terraform runtime's CLI handling: finding the binary, error lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.base import InvalidInput, ResourceRequest, RuntimeOptions, Unavailable
from stackflow.runtimes.terraform import TerraformRuntime
from stackflow.runtimes.terraform.cli import Result, error_line, failure, find_binary

RID = "hashicorp:random:random_password:pw"


def diagnostic(summary: str, detail: str, filename: str, context: str | None) -> dict[str, Any]:
    diag: dict[str, Any] = {
        "severity": "error",
        "summary": summary,
        "detail": detail,
        "range": {"filename": filename, "start": {"line": 8}},
    }
    if context:
        diag["snippet"] = {"context": context}
    return {"@level": "error", "diagnostic": diag}


def test_missing_binary_is_unavailable_naming_the_path_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "tofu"
    monkeypatch.setenv("STACKFLOW_TF_BIN", str(missing))
    with pytest.raises(Unavailable) as err:
        find_binary()
    assert str(err.value) == (
        f"the OpenTofu CLI {missing} (STACKFLOW_TF_BIN) does not exist: run `make setup` on "
        "this worker (it builds OpenTofu), or set STACKFLOW_TF_BIN to a tofu or terraform binary"
    )
    monkeypatch.setenv("STACKFLOW_TF_BIN", str(tmp_path))
    with pytest.raises(Unavailable, match=r"\(STACKFLOW_TF_BIN\) is not an executable file"):
        find_binary()


async def test_missing_binary_through_the_runtime_names_the_resource(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STACKFLOW_TF_BIN", str(tmp_path / "tofu"))
    runtime = TerraformRuntime(root=tmp_path / "tf")
    request = ResourceRequest(
        id=RID,
        type="Terraform",
        attributes={"length": 8},
        extensions={
            "provider": "registry.terraform.io/hashicorp/random/3.6.0",
            "resourceType": "random_password",
        },
    )
    options = RuntimeOptions(project="p", workspace="w")
    with pytest.raises(Unavailable) as err:
        await runtime.preview(request, options)
    message = str(err.value)
    assert message.startswith(f"{RID}: the OpenTofu CLI {tmp_path / 'tofu'} (STACKFLOW_TF_BIN)")
    assert "make setup" in message and "\n" not in message
    assert err.value.resource_id == RID and err.value.retryable


def test_config_errors_are_invalid_input_naming_resource_and_argument() -> None:
    result = Result(
        argv=["tofu", "plan"],
        code=1,
        out="",
        err="",
        messages=[
            diagnostic(
                "Extraneous JSON object property",
                'No argument or block type is named "lenght".',
                "main.tf.json",
                "resource.random_password.pw",
            )
        ],
    )
    exc = failure(RID, "terraform plan", result, config_stage=True)
    assert type(exc) is InvalidInput and not exc.retryable
    # the line of the file stackflow generated would only confuse: not shown
    assert str(exc) == (
        f"{RID}: terraform plan failed: Extraneous JSON object property: "
        'No argument or block type is named "lenght".'
    )
    # found at apply time (no preview ran), a config error is still not retried
    assert type(failure(RID, "terraform apply", result, config_stage=False)) is InvalidInput


def test_error_line_keeps_places_outside_the_generated_config() -> None:
    result = Result(
        argv=["tofu", "plan"],
        code=1,
        out="",
        err="",
        messages=[
            diagnostic("Invalid provider configuration", "bad", "main.tf.json", 'provider "aws"'),
            diagnostic("Module error", "boom", "modules/x/main.tf", "module.x"),
        ],
    )
    assert error_line(result) == (
        'Invalid provider configuration: bad (in provider "aws"); '
        "Module error: boom (modules/x/main.tf:8, module.x)"
    )


def test_a_plan_changes_nothing_only_when_its_messages_say_so() -> None:
    """Without show, a preview is built from the state: only for a plan whose summary counts
    nothing and whose refresh reported no drift."""
    from stackflow.runtimes.terraform.workdir import changes_nothing

    def summary(**counts: int) -> dict[str, Any]:
        changes = {"add": 0, "change": 0, "import": 0, "remove": 0, **counts}
        return {"type": "change_summary", "changes": {**changes, "operation": "plan"}}

    version = {"type": "version", "terraform": "1.12.6"}
    assert changes_nothing([version, summary()])
    assert not changes_nothing([version, summary(change=1)])
    assert not changes_nothing([summary(forget=1)])  # any count, known or not
    drift = {"type": "resource_drift", "change": {"action": "update"}}
    assert not changes_nothing([version, drift, summary()])
    planned = {"type": "planned_change", "change": {"action": "update"}}
    assert not changes_nothing([planned, summary()])
    assert not changes_nothing([version])  # no summary: an error, or another tofu
    assert not changes_nothing([summary(), summary()])
