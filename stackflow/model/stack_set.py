"""Stack sets as data: a file naming a set and its stacks (each a spec file beside it or a
spec at a commit of a git repository, and the stacks it depends on), and the
``$stack.<project>/<workspace>.<resource id>.<field>`` references by which a spec reads a
value another stack recorded. Loading, the graph and resolving are
:mod:`stackflow.engine.stack_set`'s."""

from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stackflow.model.source import SourceRef

STACK_REF_PREFIX = "$stack."
MEMBER_LIMIT = 200
"""Stacks one set may name (each member is a line of the set run's status and history)."""
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
STACK = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"


class GitMember(BaseModel):
    """A member's spec at an exact commit of a git repository (the worker fetches it)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2000)
    ref: str = Field(pattern=r"^[0-9a-f]{40}$")
    """The commit (40 hex digits): a set run names exactly what it applies."""
    path: str = Field(min_length=1, max_length=1000)

    def source(self) -> SourceRef:
        return SourceRef(url=self.url, commit=self.ref, path=self.path)


class SetMember(BaseModel):
    """One stack of a set: where its spec is and which stacks it follows."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    project: str = Field(min_length=1, max_length=200, pattern=NAME)
    workspace: str = Field(default="default", min_length=1, max_length=200, pattern=NAME)
    spec: str | None = Field(default=None, min_length=1, max_length=1000)
    """A spec file, relative to the set file."""
    git: GitMember | None = None
    depends_on: list[str] = Field(default_factory=list, alias="dependsOn", max_length=MEMBER_LIMIT)
    """``project/workspace`` of the stacks (of the set) this one runs after."""
    context: dict[str, Any] = Field(default_factory=dict)
    """Merged over the spec's ``context``: a target's own variables (``kubeContext``,
    ``kubeConfig``, ``env``), so one spec file serves many targets."""

    @field_validator("depends_on")
    @classmethod
    def _stacks(cls, value: list[str]) -> list[str]:
        for item in value:
            if not re.match(STACK, item):
                raise ValueError(f"{item!r} is not a stack: write project/workspace")
        return value

    @model_validator(mode="after")
    def _one_spec(self) -> SetMember:
        if (self.spec is None) == (self.git is None):
            raise ValueError("give one of spec (a file) and git {url, ref, path}")
        return self

    @property
    def name(self) -> str:
        return f"{self.project}/{self.workspace}"


DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
BAKE_LIMIT = 7 * 86400
WAVE_LIMIT = 50


def seconds(text: str | float) -> float:
    """``30s``, ``5m``, ``1h30m`` (or a number of seconds) as seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = DURATION.match(text.strip())
    if not text.strip() or m is None:
        raise ValueError(f"{text!r}: write a duration such as 10s, 5m or 1h30m")
    hours, minutes, secs = (int(g or 0) for g in m.groups())
    return float(hours * 3600 + minutes * 60 + secs)


class Wave(BaseModel):
    """One wave of a rollout: the stacks it applies (``project/workspace`` globs), at most
    ``max_parallel`` at once; ``bake``: how long it must stay applied before the next wave
    starts (a durable timer); ``gate``: ``approval`` (wait for the set's approve Update
    before the wave), ``readiness`` (each stack waits until its resources are ready) or
    ``policy`` (the wave's stacks previewed with their policies before any starts: a denial
    halts the rollout there, a required approval waits for the set's approve Update)."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1, max_length=MEMBER_LIMIT)
    max_parallel: int = Field(default=4, ge=1, le=50)
    bake: float = Field(default=0.0, ge=0, le=BAKE_LIMIT)
    gate: Literal["none", "approval", "readiness", "policy"] = "none"

    _bake = field_validator("bake", mode="before")(classmethod(lambda cls, v: seconds(v)))


class Strategy(BaseModel):
    """A rollout: ordered waves, and the failed stacks it tolerates before it halts."""

    model_config = ConfigDict(extra="forbid")

    waves: list[Wave] = Field(min_length=1, max_length=WAVE_LIMIT)
    error_budget: int = Field(default=0, ge=0, le=MEMBER_LIMIT)


class StackSet(BaseModel):
    """A set file: its name and its stacks (each stack once), and a rollout strategy."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=NAME)
    stacks: list[SetMember] = Field(min_length=1, max_length=MEMBER_LIMIT)
    strategy: Strategy | None = None

    @model_validator(mode="after")
    def _once(self) -> StackSet:
        seen: set[str] = set()
        for index, member in enumerate(self.stacks):
            if member.name in seen:
                raise ValueError(f"stacks[{index}]: {member.name} is named twice")
            seen.add(member.name)
        return self


class StackReference(NamedTuple):
    """``$stack.<stack>.<resource_id>.<path>`` split: ``path`` is a dotted field path."""

    stack: str
    resource_id: str
    path: str

    @property
    def text(self) -> str:
        return f"{STACK_REF_PREFIX}{self.stack}.{self.resource_id}.{self.path}"
