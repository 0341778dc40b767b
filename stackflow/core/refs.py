"""The small reference types: the Temporal run that holds a stack (:class:`RunRef`) and the
stack itself (:class:`StackRef`), on the wire and in the state layer."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict


class RunRef(BaseModel):
    """A Temporal run: the only kind of writer that may hold a stack. On the wire
    ``{"workflow_id": ..., "run_id": ...}``; ``RunRef(workflow_id, run_id)`` in code."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str

    def __init__(self, workflow_id: str, run_id: str, **data: Any) -> None:
        super().__init__(workflow_id=workflow_id, run_id=run_id, **data)

    def __str__(self) -> str:
        return f"run {self.run_id} of workflow {self.workflow_id}"


class StackRef(BaseModel):
    """A stack: one workspace of a project, what releases, the lock and every state write
    name. ``StackRef(project, workspace)`` in code, ``project/workspace`` in messages and
    keys; hashable. Wire models, database rows and the CLI's JSON keep the two fields
    ``project`` and ``workspace`` (:class:`StackFields` names them as one)."""

    model_config = ConfigDict(frozen=True)

    project: str
    workspace: str

    def __init__(self, project: str, workspace: str, **data: Any) -> None:
        super().__init__(project=project, workspace=workspace, **data)

    def __str__(self) -> str:
        return f"{self.project}/{self.workspace}"

    @property
    def cli_flags(self) -> str:
        """The options of a ``stackflow`` command that name this stack."""
        return f"--project {self.project} --workspace {self.workspace}"


class _HasStackFields(Protocol):
    @property
    def project(self) -> str: ...
    @property
    def workspace(self) -> str: ...


class StackFields:
    """Mixin of a model that keeps its stack as the fields ``project`` and ``workspace`` (what
    travels through Temporal, is stored or printed stays as it is): ``.stack`` is it as a
    :class:`StackRef`, a property, so serialization does not change."""

    @property
    def stack(self: _HasStackFields) -> StackRef:
        return StackRef(self.project, self.workspace)
