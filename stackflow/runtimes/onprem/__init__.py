"""OnPrem runtime (type ``OnPrem``): files and directories on this machine.

``rules.py`` (what the engine asks), ``policy.py`` (the roots and limits every path is held
to), ``files.py`` (one checked path and what is done to it), ``batch.py`` (calls made at
once, run together), ``runtime.py`` (the runtime).
"""

from stackflow.runtimes.onprem.files import OnPremAttributes
from stackflow.runtimes.onprem.runtime import OnPremRuntime, apply_sync

__all__ = ["OnPremAttributes", "OnPremRuntime", "apply_sync"]
