"""The API's request and response bodies (what ``/openapi.json`` describes). The answers are
the client's light types (:mod:`stackflow.client.types`) as pydantic models: the same
fields, and their names and types are held equal by tests/unit/test_client_types.py; the
operations and what each takes are the client's own."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stackflow.client import types
from stackflow.model.drift import DriftReport
from stackflow.model.release import Phase, Release
from stackflow.model.source import SourceMode
from stackflow.policy_gate.bundle import PolicyBundle
from stackflow.temporal.operation import REVISION_LIMIT, Pattern

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
    max_concurrency: int = Field(default=8, ge=1, le=500)
    repair: bool = False
    """drift: start an apply of the last spec when drift is found."""
    message: str | None = Field(default=None, max_length=1000)
    """Kept with the run (its memo) and shown by ``GET …/runs/{run_id}``."""
    policy: PolicyBundle | None = None
    """Rego modules (``{"modules": {"name.rego": "package stackflow …"}}``) this run
    evaluates besides its project's bundle, as ``--policy DIR`` does."""


class RunCreated(BaseModel):
    run_id: str
    workflow_id: str
    operation: RunOperation
    status_url: str
    events_url: str
    """The run's event stream (NDJSON, or SSE with ``Accept: text/event-stream``)."""


class StepRequest(BaseModel):
    """``POST …/runs/{run_id}/approve|reject|retry|abort|cancel``."""

    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(default=None, max_length=2000)


class StepResult(BaseModel):
    run_id: str
    workflow_id: str
    action: str
    result: str


class RunView(BaseModel):
    """``GET …/runs/{run_id}``: the run's phase and progress (the ``status`` query while it
    runs, its result once it has ended)."""

    run_id: str
    workflow_id: str
    operation: str
    status: str
    """Temporal's: running, completed, failed, canceled, terminated, timed_out, …"""
    phase: Phase | None = None
    revision: int | None = None
    total: int = 0
    done: int = 0
    failed: int = 0
    running: list[str] = Field(default_factory=list)
    summary: dict[str, Any] = Field(default_factory=dict)
    eta_seconds: float | None = None
    error: str | None = None
    error_type: str | None = None
    requested_by: str | None = None
    approved_by: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    result: dict[str, Any] | None = None
    """A drift check's result (drifted, summary, repair) once it has ended."""


class RunSummary(BaseModel):
    run_id: str
    workflow_id: str
    operation: str
    status: str
    requested_by: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None


class RunPage(BaseModel):
    """``GET …/runs``: one page; ``next_page_token`` (as ``?page_token=``) gets the next."""

    runs: list[RunSummary]
    next_page_token: str | None = None


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class PolicyView(BaseModel):
    """A project's policy bundle as ``PUT|GET /v1/projects/{project}/policy`` answer it."""

    project: str
    digest: str
    modules: list[str]
    updated_by: str | None = None
    updated_at: datetime | None = None


class SourceView(BaseModel):
    """A stack's git source as ``PUT|GET /v1/stacks/{project}/{workspace}/source`` answer it:
    never its secret."""

    url: str
    ref: str
    path: str
    on_push: SourceMode
    """What a push to ``ref`` starts: an apply or a preview of the pushed commit."""
    auto_approve: bool


class NotificationTargetView(BaseModel):
    """A project's notification destination as the API answers it: never its secret."""

    name: str
    url: str
    types: list[str]


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
