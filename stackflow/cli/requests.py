"""The checks a run command makes of its options before it sends anything, with the engine's
models: each refusal names its option (exit 2), in the CLI's words rather than the API's
field names. Only for what is unusual (``stackflow.cli.remote.check_locally``): the API
checks every request again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackflow.api.runs import option_error
from stackflow.cli.runs import current_user
from stackflow.core.errors import SpecError
from stackflow.engine.spec import parse_spec_text
from stackflow.temporal.operation import OperationInput, check_request

SPEC_WORKFLOWS = ("PreviewWorkflow", "ApplyWorkflow")


def check_options(workflow: str, o: dict[str, Any], text: str | None) -> None:
    """The workflow input the options ``o`` (and the spec file's ``text``) make, checked as
    the API will check it."""
    fields: dict[str, Any] = {}
    if workflow in SPEC_WORKFLOWS and text is not None:
        source = "<stdin>" if o["file"] == "-" else str(Path(o["file"]))
        fields["spec"] = parse_spec_text(text, source).model_dump(mode="json", by_alias=True)
    if workflow not in ("RefreshWorkflow", "PreviewWorkflow"):
        fields.update(max_concurrency=o["max_concurrency"], fail_fast=o["fail_fast"])
        fields["on_failure"] = o["on_failure"]
    if workflow in SPEC_WORKFLOWS:
        fields.update(ignore_fields=o["ignore_field"], force=o["force"], adopt=o["adopt"])
    if workflow == "RollbackWorkflow":
        fields["to_revision"] = o["to"]
    else:
        fields.update(targets=o["target"], excludes=o["exclude"])
    fields["unavailable_timeout_seconds"] = o["unavailable_timeout"]
    try:
        request = OperationInput(
            project=o["project"], workspace=o["workspace"], operator=current_user(), **fields
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {option_error(exc, flags=True)}") from None
    check_request(request)
