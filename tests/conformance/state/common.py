"""What the per-protocol state suites share."""

from __future__ import annotations

from stackflow.spec import Resource
from stackflow.state.backend import RunRef

R1 = RunRef("stackflow/p/w", "run-1")
R2 = RunRef("stackflow/p/w", "run-2")


def res(rid: str, **attributes: object) -> Resource:
    return Resource.model_validate({"id": rid, "type": "OnPrem", "attributes": attributes})
