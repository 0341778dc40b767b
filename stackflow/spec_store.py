"""Specs by content address in the state backend, so every worker reads the same spec.

The first activity of a run stores the spec that came with the workflow input and passes
``sha256:<hex>`` on; activities load it by that ref (hash checked, cached per process: a
ref always names the same bytes).
"""

from __future__ import annotations

from stackflow.ref_cache import RefCache
from stackflow.spec import Resource, Spec
from stackflow.state.backend import StateBackend, check_ref

_CACHED = 16


class SpecStore:
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self._cache: RefCache[str, tuple[Spec, dict[str, Resource]]] = RefCache(_CACHED)

    def put(self, spec: Spec) -> str:
        return self.backend.put_spec(spec)

    def _load(self, ref: str) -> tuple[Spec, dict[str, Resource]]:
        spec = self.backend.get_spec(ref)
        return spec, {resource.id: resource for resource in spec.resources}

    def _entry(self, ref: str) -> tuple[Spec, dict[str, Resource]]:
        check_ref(ref, "spec_ref")
        return self._cache.get(ref, self._load)

    def get(self, ref: str) -> Spec:
        return self._entry(ref)[0]

    def resources(self, ref: str) -> dict[str, Resource]:
        """The spec's resources by id (cached with the spec)."""
        return self._entry(ref)[1]
