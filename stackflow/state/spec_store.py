"""Specs by content address in the state backend, so every worker reads the same spec.

The first activity of a run stores the spec that came with the workflow input and passes
``sha256:<hex>`` on; activities load it by that ref (hash checked, cached per process: a
ref always names the same bytes).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from stackflow.core.ref_cache import RefCache
from stackflow.engine.spec import load_stored_spec
from stackflow.model.spec import Resource, Spec
from stackflow.state.backend import StateBackend, check_ref

_CACHED = 16
CACHED_SPEC_BYTES = 16 * 1024 * 1024
"""The stored JSON of the specs a process keeps parsed, in all (the most recent one kept
whatever its size): parsed, a spec takes about eight times its JSON (a 10,000-ConfigMap
spec: 2.9 MB stored, 25 MB parsed). Sixteen of them, the count alone, took 400 MB."""


class _Entry(NamedTuple):
    spec: Spec
    resources: dict[str, Resource]
    stored_bytes: int


class SpecStore:
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self._cache: RefCache[str, _Entry] = RefCache(
            _CACHED, weigh=lambda entry: entry.stored_bytes, budget=CACHED_SPEC_BYTES
        )

    def put(self, spec: Spec) -> str:
        return self.backend.put_spec(spec)

    def _load(self, ref: str) -> _Entry:
        body = self.backend.get_blob("spec_ref", ref)
        spec = load_stored_spec(json.loads(body), source=ref)
        return _Entry(spec, {resource.id: resource for resource in spec.resources}, len(body))

    def _entry(self, ref: str) -> _Entry:
        check_ref(ref, "spec_ref")
        return self._cache.get(ref, self._load)

    def get(self, ref: str) -> Spec:
        return self._entry(ref).spec

    def resources(self, ref: str) -> dict[str, Resource]:
        """The spec's resources by id (cached with the spec)."""
        return self._entry(ref).resources
