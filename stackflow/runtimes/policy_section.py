"""The generic part of a worker-policy section, the API a runtime's own section is written
against (``RuntimeRules.policy_section``): :class:`PolicySection` (unknown keys refused,
``PER_PROJECT`` settings narrowed by a project's section), the ways a project's setting
narrows the worker's (``narrower_*``, :func:`added`), and the two errors of the worker
policy. :mod:`stackflow.runtimes.policy` builds the policy of these sections."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from stackflow.core.errors import SpecError, StackflowError
from stackflow.runtimes.policy_paths import real_path, within


class PolicyViolation(SpecError):
    """The worker's policy refuses what a resource asks for."""

    def __init__(self, resource_id: str, field: str, problem: str) -> None:
        super().__init__(f"{resource_id}: {field}: {problem}")
        self.resource_id = resource_id
        self.field = field


class PolicyConfigError(StackflowError):
    """The worker's policy settings are invalid (a worker problem, not the spec's: exit 1):
    the worker refuses to start, one line."""


Narrow = Callable[[Any, Any], Any]
"""How a project's setting narrows the worker's: (the worker's value, the project's) -> the
project's effective value; ValueError says how the project's is wider."""

_GLOB_CHARS = "*?["


def glob_covers(outer: str, inner: str) -> bool:
    """Whether every name the glob ``inner`` matches is matched by the glob ``outer`` (sound,
    not complete: an ``inner`` this cannot prove narrower counts as wider)."""
    if outer in (inner, "*"):
        return True
    cut = [inner.index(c) for c in _GLOB_CHARS if c in inner]
    if not cut:
        return fnmatch.fnmatchcase(inner, outer)
    head = outer[:-1]
    if outer.endswith("*") and not any(c in head for c in _GLOB_CHARS):
        return inner[: min(cut)].startswith(head)
    return False


def narrower_flag(worker: bool, project: bool) -> bool:
    if project and not worker:
        raise ValueError("is off for the whole worker; a project may only turn it off")
    return project


def narrower_size(worker: int, project: int) -> int:
    if project > worker:
        raise ValueError(f"{int(project)} is more than the worker's {int(worker)}")
    return project


def narrower_globs(
    worker: tuple[str, ...] | None, project: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """Each of the project's globs within one of the worker's (None: any)."""
    if worker is None:
        return project
    if project is None:
        raise ValueError(f"any is wider than the worker's ({', '.join(worker) or 'none'})")
    for pattern in project:
        if not any(glob_covers(outer, pattern) for outer in worker):
            raise ValueError(
                f"{pattern!r} is not within the worker's ({', '.join(worker) or 'none'})"
            )
    return project


def narrower_paths(worker: tuple[str, ...], project: tuple[str, ...]) -> tuple[str, ...]:
    """Each of the project's paths at or under one of the worker's (through symlinks)."""
    outer = [real_path(path) for path in worker]
    for path in project:
        if not any(within(real_path(path), root) for root in outer):
            raise ValueError(f"{path} is outside the worker's ({', '.join(worker) or 'none'})")
    return project


def narrower_host_roots(worker: tuple[str, ...], project: tuple[str, ...]) -> tuple[str, ...]:
    """Each of the project's ``host:root`` within one of the worker's (glob and root)."""
    pairs = [entry.partition(":/") for entry in worker]
    for entry in project:
        glob, _, root = entry.partition(":/")
        if not any(glob_covers(g, glob) and within(f"/{root}", f"/{r}") for g, _, r in pairs):
            raise ValueError(f"{entry} is outside the worker's ({', '.join(worker) or 'none'})")
    return project


def added(worker: tuple[str, ...], project: tuple[str, ...]) -> tuple[str, ...]:
    """The worker's and the project's: a project adds to them, never removes."""
    return tuple(dict.fromkeys((*worker, *project)))


class PolicySection(BaseModel):
    """One section of the worker policy (``terraform:``, ``kubernetes:``, a plug-in runtime's
    own, named in its rules: ``RuntimeRules.policy_section``). Unknown keys are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    PER_PROJECT: ClassVar[Mapping[str, Narrow]] = {}
    """The settings a project's section may set, each with how it narrows the worker's."""

    def narrowed(self, raw: Mapping[str, Any]) -> Self:
        """This section as a project's ``raw`` settings narrow it. ValueError (naming the
        setting, ``key: problem``) when one is unknown, whole-worker only, or wider."""
        for key in raw:
            if key not in type(self).model_fields:
                raise ValueError(f"{key}: not a setting")
            if key not in self.PER_PROJECT:
                raise ValueError(f"{key}: applies to the whole worker, not per project")
        try:
            parsed = type(self).model_validate(dict(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
        updates: dict[str, Any] = {}
        for key in raw:
            try:
                updates[key] = self.PER_PROJECT[key](getattr(self, key), getattr(parsed, key))
            except ValueError as exc:
                raise ValueError(f"{key}: {exc} (a project's section may only narrow)") from None
        return self.model_copy(update=updates)

    def differences(self, other: Self) -> list[str]:
        """``key=value`` for each per-project setting where ``other`` differs (summaries)."""
        out = []
        for key in self.PER_PROJECT:
            mine, theirs = getattr(self, key), getattr(other, key)
            if mine != theirs:
                shown = "any" if theirs is None else theirs
                if isinstance(theirs, tuple):
                    shown = ",".join(theirs) or "none"
                out.append(f"{key}={shown}")
        return out
