"""The API's answers as light types, declared once: what the typed client returns and what the
server's routes answer with (``stackflow.api.models.answer`` makes each one's response model,
for FastAPI and ``/openapi.json``; the server imports this module, never the reverse).
Standard library only, so a command through the API starts without pydantic, the engine or
Temporal: a :class:`Record` per answer, its fields declared by annotations, and
:func:`parse`, one small validator of their types (extra fields are ignored, as the
server's models ignore them). Records are plain classes, not dataclasses: importing
``dataclasses`` (it imports ``inspect``) and making a dataclass per answer costs a command's
start more than its whole HTTP exchange.

The engine's values a client needs (phases, operations, event types, the stream's name and
version) are here as plain tuples; tests/unit/test_client_types.py keeps them equal to the
engine's enums."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

R = TypeVar("R", bound="Record")

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
    "stack_complete",
)
"""``stackflow.model.events.EventType``'s values."""
STREAM_NAME = "stackflow.events"
STREAM_VERSION = 1
"""``stackflow.model.events.STREAM_NAME`` and ``STREAM_VERSION``: an event stream's first line."""
MAX_SPEC_BYTES = 512 * 1024 * 1024
"""``stackflow.engine.spec.MAX_SPEC_BYTES``: the largest spec file a command reads."""
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
        {"spec", "spec_yaml", "commit", "targets", "excludes", "policy", "ignore_fields"}
        | {"force", "adopt", "unavailable_timeout_seconds", "policy_input"}
    ),
    RunOperation.apply: frozenset(
        {"spec", "spec_yaml", "commit", "auto_approve", "targets", "excludes", "on_failure"}
        | {"max_concurrency", "policy", "fail_fast", "ignore_fields", "watch", "force", "adopt"}
        | {"unavailable_timeout_seconds"}
    ),
    RunOperation.destroy: frozenset(
        {"auto_approve", "targets", "excludes", "on_failure", "max_concurrency", "policy"}
        | {"fail_fast", "unavailable_timeout_seconds"}
    ),
    RunOperation.rollback: frozenset(
        {"to_revision", "auto_approve", "on_failure", "max_concurrency", "policy", "fail_fast"}
        | {"unavailable_timeout_seconds"}
    ),
    RunOperation.refresh: frozenset(
        {"auto_approve", "targets", "excludes", "unavailable_timeout_seconds"}
    ),
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


class Stack:
    """A stack as a command names it (``StackRef`` without pydantic): ``project/workspace``
    in messages."""

    __slots__ = ("project", "workspace")

    def __init__(self, project: str, workspace: str) -> None:
        self.project, self.workspace = project, workspace

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stack) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

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


class New:
    """A field's default made anew for each record (``New(list)``: an empty list)."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory


NEW_LIST: Any = New(list)
NEW_DICT: Any = New(dict)


class Record:
    """An answer's fields, declared as annotated class attributes (a class attribute's value
    is the field's default; :class:`New` makes one per record). ``CHOICES``: the values a
    text field may take."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, **values: Any) -> None:
        for name, _ in fields_of(type(self)):
            if name in values:
                value = values.pop(name)
            elif name in vars(type(self)):
                value = getattr(type(self), name)
                value = value.factory() if isinstance(value, New) else value
            else:
                raise TypeError(f"{type(self).__name__}: {name} missing")
            setattr(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}: no field {', '.join(values)}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({shown})"

    __hash__ = None  # type: ignore[assignment]


_FIELDS: dict[type, list[tuple[str, str]]] = {}


def fields_of(cls: type[Record]) -> list[tuple[str, str]]:
    """(name, annotation text) of each field of ``cls``, in declaration order."""
    found = _FIELDS.get(cls)
    if found is None:
        found = [
            (name, str(kind))
            for name, kind in cls.__annotations__.items()
            if not str(kind).startswith("ClassVar")
        ]
        _FIELDS[cls] = found
    return found


def required(cls: type[Record], name: str) -> bool:
    return name not in vars(cls)


# ---- runs -------------------------------------------------------------------------------------
class RunCreated(Record):
    """The answer to ``POST …/runs``."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"operation": tuple(RunOperation)}

    run_id: str
    workflow_id: str
    operation: str
    status_url: str
    events_url: str
    """The run's event stream (NDJSON, or SSE with ``Accept: text/event-stream``)."""


class StepResult(Record):
    """The answer to ``POST …/runs/{run_id}/approve|reject|retry|abort|cancel``."""

    run_id: str
    workflow_id: str
    action: str
    result: str


class RunView(Record):
    """``GET …/runs/{run_id}``: the run's phase and progress (the ``status`` query while it
    runs, its result once it has ended)."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"phase": PHASES}

    run_id: str
    workflow_id: str
    operation: str
    status: str
    """Temporal's: running, completed, failed, canceled, terminated, timed_out, …"""
    phase: str | None = None
    revision: int | None = None
    total: int = 0
    done: int = 0
    failed: int = 0
    running: list[str] = NEW_LIST
    summary: dict[str, Any] = NEW_DICT
    eta_seconds: float | None = None
    error: str | None = None
    error_type: str | None = None
    requested_by: str | None = None
    approved_by: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    result: dict[str, Any] | None = None
    """The run's result once it has ended: a drift check's (drifted, summary, repair), an
    operation's without its changes (``…/preview`` has them): its nodes' results (those that
    did not succeed, past 500), counts and policy decision."""


class RunSummary(Record):
    run_id: str
    workflow_id: str
    operation: str
    status: str
    requested_by: str | None = None
    message: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None


class RunPage(Record):
    """``GET …/runs``: one page; ``next_page_token`` (as ``?page_token=``) gets the next."""

    runs: list[RunSummary]
    next_page_token: str | None = None


class Health(Record):
    status: str
    checks: dict[str, str] = NEW_DICT


# ---- the event stream -------------------------------------------------------------------------
class StreamHeader(Record):
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


class RunEvent(Record):
    """One event of the stream: ``seq``, ``type`` and ``time``, the rest its ``data``."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"type": EVENT_TYPES}

    seq: int
    type: str
    time: datetime
    data: dict[str, Any] = NEW_DICT

    def wire(self) -> dict[str, Any]:
        """The event as one stream line: ``{seq, type, time, ...data}``."""
        return {"seq": self.seq, "type": self.type, "time": self.time.isoformat(), **self.data}

    def line(self) -> str:
        return json.dumps(self.wire(), separators=(",", ":"), ensure_ascii=False)


# ---- projects and stacks ----------------------------------------------------------------------
class PolicyView(Record):
    """A project's policy bundle as ``PUT|GET /v1/projects/{project}/policy`` answer it."""

    project: str
    digest: str
    modules: list[str]
    updated_by: str | None = None
    updated_at: datetime | None = None


class SourceView(Record):
    """A stack's git source as ``PUT|GET /v1/stacks/{project}/{workspace}/source`` answer it:
    never its secret."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"on_push": SOURCE_MODES}

    url: str
    ref: str
    path: str
    on_push: str
    """What a push to ``ref`` starts: an apply or a preview of the pushed commit."""
    auto_approve: bool


class NotificationTargetView(Record):
    """A project's notification destination as the API answers it: never its secret."""

    name: str
    url: str
    types: list[str]


# ---- the validator ----------------------------------------------------------------------------
def parse(cls: type[R], data: Any, where: str = "") -> R:
    """A record of ``cls`` from the JSON ``data``, every field of its type (an int where a
    float is asked, ISO 8601 text where a datetime is); Invalid otherwise."""
    if not isinstance(data, dict):
        raise Invalid(where or cls.__name__, "not an object")
    values: dict[str, Any] = {}
    for name, kind in fields_of(cls):
        at = f"{where}.{name}" if where else name
        if name not in data:
            if required(cls, name):
                raise Invalid(at, "Field required")
            continue
        value = _value(kind, data[name], at, cls)
        choices = cls.CHOICES.get(name)
        if choices is not None and value is not None and value not in choices:
            raise Invalid(at, f"not one of {', '.join(choices)}")
        values[name] = value
    return cls(**values)


def _value(kind: str, value: Any, at: str, owner: type) -> Any:
    """``value`` as the annotation ``kind`` (text: ``str``, ``int | None``, ``list[X]``,
    ``dict[str, X]``, ``datetime``, ``Any`` or a record's class name) reads it."""
    if kind == "Any":
        return value
    if kind.endswith(" | None"):
        return None if value is None else _value(kind[: -len(" | None")], value, at, owner)
    if kind.startswith("list["):
        if not isinstance(value, list):
            raise Invalid(at, "not a list")
        return [_value(kind[5:-1], v, f"{at}.{n}", owner) for n, v in enumerate(value)]
    if kind.startswith("dict[str, "):
        if not isinstance(value, dict):
            raise Invalid(at, "not an object")
        return {k: _value(kind[10:-1], v, f"{at}.{k}", owner) for k, v in value.items()}
    if kind == "bool":
        if not isinstance(value, bool):
            raise Invalid(at, "not a boolean")
        return value
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(at, "not a number")
        if kind == "int" and value != int(value):
            raise Invalid(at, "not an integer")
        return int(value) if kind == "int" else float(value)
    if kind == "str":
        if not isinstance(value, str):
            raise Invalid(at, "not a string")
        return value
    if kind == "datetime":
        if not isinstance(value, str):
            raise Invalid(at, "not a timestamp")
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise Invalid(at, "not a timestamp") from None
    record = getattr(sys.modules[owner.__module__], kind)
    return parse(record, value, at)


def to_json(obj: Any) -> Any:
    """A record (or list of them) as JSON data (timestamps as ISO 8601 text)."""
    if isinstance(obj, list):
        return [to_json(item) for item in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {key: to_json(value) for key, value in obj.items()}
    if isinstance(obj, Record):
        return {name: to_json(getattr(obj, name)) for name, _ in fields_of(type(obj))}
    return obj
