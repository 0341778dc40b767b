"""What the per-protocol state suites share."""

from __future__ import annotations

from typing import Any

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.spec import Resource
from stackflow.state.backend import StateBackend

R1 = RunRef("stackflow/p/w", "run-1")
R2 = RunRef("stackflow/p/w", "run-2")
STACK = StackRef("p", "w")
"""The stack the suites write (``R1`` and ``R2`` are runs of its workflow)."""


def res(rid: str, **attributes: object) -> Resource:
    return Resource.model_validate({"id": rid, "type": "OnPrem", "attributes": attributes})


class Narrowed:
    """A backend seen through some protocols only: any other attribute raises
    AttributeError, so a suite written against them uses nothing else, and a new backend
    that implements just those protocols can run it."""

    def __init__(self, target: StateBackend, protocols: tuple[type, ...]) -> None:
        for protocol in protocols:
            assert isinstance(target, protocol), f"{type(target).__name__} is no {protocol}"
        self.target = target
        self.protocols = protocols
        self.allowed = {name for p in protocols for name in vars(p) if not name.startswith("_")}

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("allowed", ()):
            return getattr(self.target, name)
        names = ", ".join(p.__name__ for p in self.__dict__.get("protocols", ()))
        raise AttributeError(f"{name!r} is not part of {names}")


def narrow(backend: StateBackend, *protocols: type) -> Any:
    """``backend`` through ``protocols`` only."""
    return Narrowed(backend, protocols)
