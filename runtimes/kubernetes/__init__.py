"""Kubernetes runtime (type ``Kubernetes``): see :mod:`runtimes.kubernetes.runtime`."""

from runtimes.kubernetes.runtime import KubernetesRuntime, NotReady

__all__ = ["KubernetesRuntime", "NotReady"]
