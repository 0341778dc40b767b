"""The workflow input of a run command, as direct mode builds and checks it: the options
(each refusal names its option, exit 2), the spec (inline, or stored first when it is over
the byte budget) and the run's own policy bundle. Through the API the same checks say why
an unusual option or spec is refused (``stackflow.cli.remote.check_locally``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from stackflow.cli.api_mode import api_mode
from stackflow.cli.runs import current_user
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.budget import BUDGET
from stackflow.engine.spec import load_spec
from stackflow.temporal.operation import OperationInput, check_request


def build_request(stack: StackRef, **fields: Any) -> OperationInput:
    try:
        request = OperationInput(
            project=stack.project, workspace=stack.workspace, operator=current_user(), **fields
        )
    except ValueError as exc:
        raise SpecError(f"invalid option: {_option_error(exc)}") from None
    check_request(request)
    return request


def _option_error(exc: ValueError) -> str:
    """``field: message`` of the first validation error, in the CLI's option names."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        name = ".".join(str(p) for p in first["loc"]) or "input"
        option = "--" + name.replace("_", "-").removesuffix("-seconds")
        return f"{option}: {first['msg']}"
    return str(exc).splitlines()[-1].strip()


def spec_input(path: str) -> dict[str, Any]:
    """How the workflow input carries the spec: inline (``{"spec": …}``, all a client needs
    is Temporal), or, when it is over the byte budget even compressed and this machine
    shares the state backend (``STACKFLOW_STATE_URL`` set), stored there first and passed
    as ``{"spec_ref": …}``. Refused (exit 2) when it must go inline and is over Temporal's
    payload limit."""
    spec = load_spec(path)
    data = spec.model_dump(mode="json", by_alias=True)
    if api_mode():
        return {"spec": data}  # the API stores it first if it is over the byte budget
    from stackflow.temporal.codec import PAYLOAD_LIMIT, encoded_size

    size = asyncio.run(encoded_size(data))
    if size > BUDGET and os.environ.get("STACKFLOW_STATE_URL"):
        from stackflow.state.backend import open_backend

        backend = open_backend()
        try:
            return {"spec_ref": backend.put_spec(spec)}
        finally:
            backend.close()
    if size > PAYLOAD_LIMIT * 0.95:
        raise SpecError(
            f"{path}: the spec is {size / 1048576:.1f} MiB compressed, over Temporal's "
            f"{PAYLOAD_LIMIT // 1048576} MiB payload limit: split it into several stacks, "
            "or set STACKFLOW_STATE_URL so the CLI stores it in the state backend first"
        )
    return {"spec": data}


def request_of(workflow: str, o: dict[str, Any], text: str | None = None) -> OperationInput:
    """The workflow input of the run the options ``o`` describe (checked: exit 2 naming
    the option), the spec read (``text``: the file's, already read) and the run's own
    policy bundle stored first."""
    fields: dict[str, Any] = {}
    if workflow in ("PreviewWorkflow", "ApplyWorkflow") and text is not None:
        from pathlib import Path

        from stackflow.engine.spec import parse_spec_text

        source = "<stdin>" if o["file"] == "-" else str(Path(o["file"]))
        fields["spec"] = parse_spec_text(text, source).model_dump(mode="json", by_alias=True)
    elif workflow in ("PreviewWorkflow", "ApplyWorkflow"):
        fields.update(spec_input(o["file"]))
    if workflow in ("PreviewWorkflow", "ApplyWorkflow", "DestroyWorkflow"):
        fields.update(policy_fields(o.get("policy")))
    if workflow != "RefreshWorkflow" and workflow != "PreviewWorkflow":
        fields.update(max_concurrency=o["max_concurrency"], fail_fast=o["fail_fast"])
        fields["on_failure"] = o["on_failure"]
    if workflow in ("PreviewWorkflow", "ApplyWorkflow"):
        fields.update(ignore_fields=o["ignore_field"], force=o["force"], adopt=o["adopt"])
    if workflow == "ApplyWorkflow":
        fields["watch"] = o["watch"]
    if workflow == "RollbackWorkflow":
        fields["to_revision"] = o["to"]
    else:
        fields.update(targets=o["target"], excludes=o["exclude"])
    fields["unavailable_timeout_seconds"] = o["unavailable_timeout"]
    return build_request(StackRef(o["project"], o["workspace"]), **fields)


def check_options(workflow: str, o: dict[str, Any], text: str | None) -> None:
    """Direct mode's checks of the options (and of the spec's ``text``), for a run through
    the API."""
    request_of(workflow, o, text)


def policy_fields(directory: str | None) -> dict[str, Any]:
    """The run's own bundle (``--policy DIR``): stored in the state backend and passed by
    ref; in API mode sent inline with the run request (``stackflow.cli.remote``)."""
    if directory is None:
        return {}
    from stackflow.policy_gate.bundle import load_bundle_dir, store_bundle

    bundle = load_bundle_dir(directory)
    if api_mode():  # checked here; the run request carries the bundle itself
        return {"policy_ref": bundle.digest}
    from stackflow.state.backend import open_backend

    backend = open_backend()
    try:
        return {"policy_ref": store_bundle(backend, bundle)}
    finally:
        backend.close()
