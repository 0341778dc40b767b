"""The one run type: the Temporal run that holds a stack, on the wire and in the state layer."""

from __future__ import annotations

from typing import Any

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
