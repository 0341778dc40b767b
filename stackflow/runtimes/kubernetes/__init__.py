"""Kubernetes runtime (type ``Kubernetes``): see :mod:`stackflow.runtimes.kubernetes.runtime`.

``rules.py`` (what the engine asks: ids, secrets, grouping) and ``policy.py`` (kubeconfigs,
contexts, plugins) are cheap to import; the runtime and its client load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stackflow.runtimes.kubernetes.failures import NotReady
    from stackflow.runtimes.kubernetes.runtime import KubernetesRuntime

__all__ = ["KubernetesRuntime", "NotReady"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stackflow.runtimes.kubernetes import runtime

        return getattr(runtime, name)
    raise AttributeError(name)
