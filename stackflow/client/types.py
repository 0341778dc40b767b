"""The API's answers as light types: what the typed client returns and the server's response
models are checked against (``stackflow.api.models`` imports this module, never the
reverse). Standard library only, so a command through the API starts without pydantic, the
engine or Temporal: a dataclass per answer and :func:`parse`, one small validator of their
field types (extra fields are ignored, as the server's models ignore them).

The engine's values a client needs (phases, operations, event types, the stream's name and
version) are here as plain tuples; tests/unit/test_client_types.py keeps them equal to the
engine's enums."""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

PHASES = (
    "generating",
    "previewing",
    "awaitingApproval",
    "applying",
    "awaitingDecision",
    "destroying",
    "succeeded",
    "failed",
)
"""``stackflow.model.release.Phase``'s values."""
EVENT_TYPES = (
    "run_start",
    "phase",
    "planned_change",
    "change_summary",
    "approval_wait",
    "policy_decision",
    "apply_start",
    "apply_complete",
    "apply_errored",
    "run_complete",
)
"""``stackflow.model.events.EventType``'s values."""
STREAM_NAME = "stackflow.events"
STREAM_VERSION = 1
"""``stackflow.model.events.STREAM_NAME`` and ``STREAM_VERSION``: an event stream's first line."""
MAX_SPEC_BYTES = 512 * 1024 * 1024
"""``stackflow.model.spec.MAX_SPEC_BYTES``: the largest spec file a command reads."""
REVISION_LIMIT = 2**31 - 1
"""``stackflow.temporal.operation.REVISION_LIMIT``: the largest release number."""
SOURCE_MODES = ("apply", "preview")
"""``stackflow.model.source.SourceMode``'s values."""


class RunOperation(StrEnum):
    preview = "preview"
    apply = "apply"
    destroy = "destroy"
    rollback = "rollback"
    refresh = "refresh"
    drift = "drift"


WORKFLOWS = {
    RunOperation.preview: "PreviewWorkflow",
    RunOperation.apply: "ApplyWorkflow",
    RunOperation.destroy: "DestroyWorkflow",
    RunOperation.rollback: "RollbackWorkflow",
    RunOperation.refresh: "RefreshWorkflow",
    RunOperation.drift: "DriftWorkflow",
}
"""The workflow each operation of the run API starts."""

TAKES: dict[RunOperation, frozenset[str]] = {
    RunOperation.preview: frozenset(
        {"spec", "spec_yaml", "commit", "targets", "excludes", "policy"}
    ),
    RunOperation.apply: frozenset(
        {
            "spec",
            "spec_yaml",
            "commit",
            "auto_approve",
            "targets",
            "excludes",
            "on_failure",
            "max_concurrency",
            "policy",
        }
    ),
    RunOperation.destroy: frozenset(
        {"auto_approve", "targets", "excludes", "on_failure", "max_concurrency", "policy"}
    ),
    RunOperation.rollback: frozenset(
        {"to_revision", "auto_approve", "on_failure", "max_concurrency", "policy"}
    ),
    RunOperation.refresh: frozenset({"auto_approve", "targets", "excludes"}),
    RunOperation.drift: frozenset({"auto_approve", "repair"}),
}
"""The fields each operation's run request takes besides ``operation`` and ``message`` (the
CLI's options of the same command); any other field given is refused by name."""


class StackLike(Protocol):
    """What names a stack to the client: ``stackflow.core.refs.StackRef``, or :class:`Stack`."""

    @property
    def project(self) -> str: ...
    @property
    def workspace(self) -> str: ...


@dataclass(frozen=True)
class Stack:
    """A stack as a command names it (``StackRef`` without pydantic): ``project/workspace``
    in messages."""

    project: str
    workspace: str

    def __str__(self) -> str:
        return f"{self.project}/{self.workspace}"

    @property
    def cli_flags(self) -> str:
        """The options of a ``stackflow`` command that name this stack."""
        return f"--project {self.project} --workspace {self.workspace}"


class Invalid(ValueError):
    """An answer that does not have a type's fields: ``where`` (a dotted path) and why."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


def one_of(*choices: str) -> Any:
    """A field's metadata: its value is one of ``choices`` (or None where it may be)."""
    return {"choices": choices}


# ---- runs -------------------------------------------------------------------------------------
@dataclass
class RunCreated:
    """The answer to ``POST …/runs``."""

    run_id: str
    workflow_id: str
    operation: str = field(metadata=one_of(*RunOperation))
    status_url: str
    events_url: str
    """The run's event stream (NDJSON, or SSE with ``Accept: text/event-stream``)."""


@dataclass
class StepResult:
    """The answer to ``POST …/runs/{run_id}/approve|reject|retry|abort|cancel``."""

    run_id: str
    workflow_id: str
    action: str
    result: str


@dataclass
class RunView:
    """``GET …/runs/{run_id}``: the run's phase and progress (the ``status`` query while it
    runs, its result once it has ended)."""

    run_id: str
    workflow_id: str
    operation: str
    status: str
    """Temporal's: running, completed, failed, canceled, terminated, timed_out, …"""
    phase: str | None = field(default=None, metadata=one_of(*PHASES))
    revision: int | None = None
    total: int = 0
    done: int = 0
    failed: int = 0
    running: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
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


@dataclass
class RunSummary:
    run_id: str
    workflow_id: str
    operation: str
    status: str
    requested_by: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass
class RunPage:
    """``GET …/runs``: one page; ``next_page_token`` (as ``?page_token=``) gets the next."""

    runs: list[RunSummary]
    next_page_token: str | None = None


@dataclass
class Health:
    status: str
    checks: dict[str, str] = field(default_factory=dict)


# ---- the event stream -------------------------------------------------------------------------
@dataclass
class StreamHeader:
    """The first line of a run's event stream."""

    project: str
    workspace: str
    workflow_id: str
    run_id: str
    stream: str = STREAM_NAME
    version: int = STREAM_VERSION

    def as_dict(self) -> dict[str, Any]:
        keys = ("stream", "version", "project", "workspace", "workflow_id", "run_id")
        return {key: getattr(self, key) for key in keys}

    def line(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))


@dataclass
class RunEvent:
    """One event of the stream: ``seq``, ``type`` and ``time``, the rest its ``data``."""

    seq: int
    type: str = field(metadata=one_of(*EVENT_TYPES))
    time: datetime
    data: dict[str, Any] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """The event as one stream line: ``{seq, type, time, ...data}``."""
        return {"seq": self.seq, "type": self.type, "time": self.time.isoformat(), **self.data}

    def line(self) -> str:
        return json.dumps(self.wire(), separators=(",", ":"), ensure_ascii=False)


# ---- projects and stacks ----------------------------------------------------------------------
@dataclass
class PolicyView:
    """A project's policy bundle as ``PUT|GET /v1/projects/{project}/policy`` answer it."""

    project: str
    digest: str
    modules: list[str]
    updated_by: str | None = None
    updated_at: datetime | None = None


@dataclass
class SourceView:
    """A stack's git source as ``PUT|GET /v1/stacks/{project}/{workspace}/source`` answer it:
    never its secret."""

    url: str
    ref: str
    path: str
    on_push: str = field(metadata=one_of(*SOURCE_MODES))
    """What a push to ``ref`` starts: an apply or a preview of the pushed commit."""
    auto_approve: bool


@dataclass
class NotificationTargetView:
    """A project's notification destination as the API answers it: never its secret."""

    name: str
    url: str
    types: list[str]


# ---- the validator ----------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def parse(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the dataclass ``cls`` from the JSON ``data``, every field of its type
    (an int where a float is asked, ISO 8601 text where a datetime is); Invalid otherwise."""
    if not isinstance(data, dict):
        raise Invalid(where or cls.__name__, "not an object")
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        at = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise Invalid(at, "Field required")
            continue
        value = _value(hints[f.name], data[f.name], at)
        choices = f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise Invalid(at, f"not one of {', '.join(choices)}")
        values[f.name] = value
    return cls(**values)


def _value(kind: Any, value: Any, at: str) -> Any:
    origin = get_origin(kind)
    if kind is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [k for k in get_args(kind) if k is not type(None)]
        if value is None and len(options) < len(get_args(kind)):
            return None
        return _value(options[0], value, at)
    if origin is list:
        if not isinstance(value, list):
            raise Invalid(at, "not a list")
        (item,) = get_args(kind)
        return [_value(item, v, f"{at}.{n}") for n, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid(at, "not an object")
        _, item = get_args(kind)
        return {k: _value(item, v, f"{at}.{k}") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise Invalid(at, "not a boolean")
        return value
    if kind is int or kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(at, "not a number")
        if kind is int and value != int(value):
            raise Invalid(at, "not an integer")
        return int(value) if kind is int else float(value)
    if kind is str:
        if not isinstance(value, str):
            raise Invalid(at, "not a string")
        return value
    if kind is datetime:
        if not isinstance(value, str):
            raise Invalid(at, "not a timestamp")
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise Invalid(at, "not a timestamp") from None
    return parse(kind, value, at)  # a dataclass


def to_json(obj: Any) -> Any:
    """A light type's instance (or list of them) as JSON data (timestamps as ISO 8601 text)."""
    if isinstance(obj, list):
        return [to_json(item) for item in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {key: to_json(value) for key, value in obj.items()}
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: to_json(getattr(obj, f.name)) for f in fields(obj)}
    return obj
