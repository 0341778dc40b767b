"""OnPrem runtime (type ``OnPrem``): files and directories on this machine.

``rules.py`` (what the engine asks), ``policy.py`` (the roots and limits every path is held
to), ``runtime.py`` (the runtime).
"""

from stackflow.runtimes.onprem.runtime import OnPremAttributes, OnPremRuntime, apply_sync

__all__ = ["OnPremAttributes", "OnPremRuntime", "apply_sync"]
