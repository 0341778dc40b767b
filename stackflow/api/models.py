"""The API's request and response bodies (what ``/openapi.json`` describes). The answers the
client reads are declared once, by the client's light types (:mod:`stackflow.client.types`):
the routes return those records and :func:`answer` is each one's response model; the
operations and what each takes are the client's own too."""

from __future__ import annotations

from types import NoneType
from typing import Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from stackflow.client import types
from stackflow.model.drift import DriftReport
from stackflow.model.release import Release
from stackflow.policy_gate.bundle import PolicyBundle
from stackflow.temporal.operation import MAX_CONCURRENCY_DEFAULT, REVISION_LIMIT, Pattern

RunOperation = types.RunOperation
WORKFLOWS = types.WORKFLOWS
TAKES = types.TAKES
"""The fields each operation takes besides ``operation`` and ``message`` (the CLI's options
of the same command); any other field given is refused by name."""


class RunRequest(BaseModel):
    """``POST /v1/stacks/{project}/{workspace}/runs``."""

    model_config = ConfigDict(extra="forbid")

    operation: RunOperation
    spec: dict[str, Any] | None = None
    """The Kusion v1 spec as a JSON object (preview, apply)."""
    spec_yaml: str | None = None
    """The spec as YAML or JSON text, read as ``stackflow -f`` reads a file."""
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    """Run the stack's git source (``PUT …/source``) at this commit, instead of a spec."""
    to_revision: int | None = Field(default=None, ge=1, le=REVISION_LIMIT)
    auto_approve: bool = False
    """Approved up front (from the preview straight to the walk): needs the approver role;
    on a four-eyes project the run still waits for another approver."""
    targets: list[Pattern] = Field(default_factory=list, max_length=100)
    excludes: list[Pattern] = Field(default_factory=list, max_length=100)
    on_failure: Literal["fail", "pause"] = "fail"
    max_concurrency: int = Field(default=MAX_CONCURRENCY_DEFAULT, ge=1, le=500)
    fail_fast: bool = False
    """Stop starting nodes once one failed (``--fail-fast``)."""
    ignore_fields: list[Pattern] = Field(default_factory=list, max_length=1000)
    """Dotted paths never diffed (``--ignore-field``)."""
    watch: bool = False
    """Wait until each resource is ready (``--watch``)."""
    force: bool = False
    """Take over fields another manager owns (Kubernetes; ``--force``): needs approver."""
    adopt: bool = False
    """Adopt existing objects no stack owns yet (``--adopt``): needs approver."""
    unavailable_timeout_seconds: float = Field(default=600.0, gt=0, le=86400)
    """Seconds unreachable infrastructure is retried before its node fails."""
    policy_input: bool = False
    """A preview keeps the input document its policies read (``stackflow policy eval``)."""
    repair: bool = False
    """drift: start an apply of the last spec when drift is found."""
    message: str | None = Field(default=None, max_length=1000)
    """Kept with the run (its memo) and shown by ``GET …/runs/{run_id}``."""
    policy: PolicyBundle | None = None
    """Rego modules (``{"modules": {"name.rego": "package stackflow …"}}``) this run
    evaluates besides its project's bundle, as ``--policy DIR`` does."""


class StepRequest(BaseModel):
    """``POST …/runs/{run_id}/approve|reject|retry|abort|cancel``."""

    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(default=None, max_length=2000)


# ---- the answers: the client's types -----------------------------------------------------------
_ANSWERS: dict[str, type[BaseModel]] = {}


def answer(record: type[types.Record]) -> type[BaseModel]:
    """The response model of the client's ``record`` (what FastAPI validates a route's
    record against, by its attributes, and what ``/openapi.json`` describes): its fields,
    defaults and docstring, a field of ``CHOICES`` a ``Literal`` of its values, a record
    it holds that record's answer. The client declares each answer once; this is its
    pydantic form."""
    found = _ANSWERS.get(record.__name__)
    if found is not None:
        return found
    hints = get_type_hints(record, localns=dict(_ANSWERS))
    fields: dict[str, Any] = {}
    for name, _ in types.fields_of(record):
        kind = hints[name]
        choices = record.CHOICES.get(name)
        if choices is not None:
            values = Literal[choices]  # type: ignore[valid-type]
            kind = values | None if NoneType in get_args(kind) else values
        if types.required(record, name):
            fields[name] = (kind, ...)
        else:
            default = vars(record)[name]
            if isinstance(default, types.New):
                default = Field(default_factory=default.factory)
            fields[name] = (kind, default)
    model = create_model(
        record.__name__,
        __config__=ConfigDict(from_attributes=True),
        __doc__=record.__doc__,
        __module__=__name__,
        **fields,
    )
    _ANSWERS[record.__name__] = model
    return model


RunCreated = answer(types.RunCreated)
StepResult = answer(types.StepResult)
RunView = answer(types.RunView)
RunSummary = answer(types.RunSummary)
RunPage = answer(types.RunPage)
Health = answer(types.Health)
PolicyView = answer(types.PolicyView)
SourceView = answer(types.SourceView)
NotificationTargetView = answer(types.NotificationTargetView)


class DriftScheduleRequest(BaseModel):
    """``PUT /v1/stacks/{project}/{workspace}/drift/schedule`` (``stackflow drift
    schedule``): a drift check every ``every``."""

    model_config = ConfigDict(extra="forbid")

    every: str = Field(min_length=1, max_length=32, examples=["30s", "5m", "1h", "1h30m"])
    """The interval: ``30s``, ``5m``, ``1h``, ``1h30m`` (at least 10 seconds)."""
    repair: bool = False
    """On drift, start an apply of the last spec (it waits for approval unless
    ``auto_approve``)."""
    auto_approve: bool = False
    """The repair apply is approved up front: needs the approver role (on a four-eyes
    project it still waits for an approver other than the one who scheduled it)."""


class DriftScheduleView(BaseModel):
    """A stack's drift schedule as ``PUT …/drift/schedule`` answers it."""

    schedule_id: str
    """The Temporal Schedule's id (``temporal schedule list``)."""
    project: str
    workspace: str
    every: str
    every_seconds: int
    repair: bool
    auto_approve: bool
    requested_by: str
    """Who scheduled it: each scheduled check's repair is requested by them."""
    created: bool
    """False when it replaced the stack's schedule."""


class DriftStatus(DriftReport):
    """``GET /v1/stacks/{project}/{workspace}/drift``: the stack's last drift report, as
    ``stackflow drift status --output json`` prints it."""

    drifted_resources: list[dict[str, Any]] = Field(default_factory=list)
    """The drifted resources' masked per-field diffs (``id``, ``action``, ``diff``)."""


class UnlockRequest(BaseModel):
    """``POST /v1/stacks/{project}/{workspace}/unlock`` (``stackflow release unlock``)."""

    model_config = ConfigDict(extra="forbid")

    force: bool = False
    """Unlock even while the holding run is open in Temporal (its later writes are
    refused); without it that is a 409 naming the run."""


class ReleaseImport(BaseModel):
    """``POST /v1/projects/{project}/releases/import`` (``stackflow release import``): the
    releases of the project's stacks, in Kusion's file form (``createTime``,
    ``modifiedTime``) or as ``GET …/releases/{revision}`` answers them."""

    model_config = ConfigDict(extra="forbid")

    releases: list[Release] = Field(min_length=1, max_length=10_000)


class ReleaseImported(BaseModel):
    project: str
    imported: dict[str, int]
    """Releases imported per stack (``project/workspace``)."""


class StackExport(BaseModel):
    project: str
    workspace: str
    releases: list[dict[str, Any]]
    """Each release in Kusion's file form (``<n>.yaml``), sensitive values masked."""


class ReleaseExport(BaseModel):
    """``GET /v1/projects/{project}/releases/export`` (``stackflow release export``)."""

    stacks: list[StackExport]
