"""What the engine asks of the OnPrem runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stackflow.runtime_rules import RuntimeRules

if TYPE_CHECKING:
    from runtimes.base import Runtime
    from stackflow.state.backend import StateBackend

TYPE_NAME = "OnPrem"


class OnPremRules(RuntimeRules):
    """Any unique id; file content is not secret by name; nodes share activities."""

    type_name: ClassVar[str] = TYPE_NAME
    grouped: ClassVar[bool] = True

    def create(self, backend: StateBackend | None) -> Runtime:
        from runtimes.onprem.runtime import OnPremRuntime

        return OnPremRuntime()


RULES = OnPremRules()
