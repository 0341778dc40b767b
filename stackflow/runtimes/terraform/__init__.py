"""Terraform runtime: Kusion-form ``Terraform`` resources driven through the OpenTofu CLI.

``rules.py`` (what the engine asks) and ``policy.py`` (providers, provisioners, env) are
cheap to import; the runtime loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stackflow.runtimes.terraform.runtime import TerraformRuntime, strip_reserved
    from stackflow.runtimes.terraform.state import RESERVED_KEYS, SENSITIVE_KEY, STATE_KEY

__all__ = ["RESERVED_KEYS", "SENSITIVE_KEY", "STATE_KEY", "TerraformRuntime", "strip_reserved"]


def __getattr__(name: str) -> Any:
    if name in ("TerraformRuntime", "strip_reserved"):
        from stackflow.runtimes.terraform import runtime

        return getattr(runtime, name)
    if name in ("RESERVED_KEYS", "SENSITIVE_KEY", "STATE_KEY"):
        from stackflow.runtimes.terraform import state

        return getattr(state, name)
    raise AttributeError(name)
