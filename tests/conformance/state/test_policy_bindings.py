"""State conformance, PolicyBindings: one policy bundle per project (a digest of a stored
blob), replaced by a push, removed. Every backend (SQLite and PostgreSQL) passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.core.errors import SpecError
from stackflow.policy_gate.bundle import PolicyBundle, fetch_bundle, store_bundle
from stackflow.state.protocols import PolicyBindings
from tests.conformance.state.common import narrow

MODULE = 'package stackflow\n\nimport rego.v1\n\ndeny contains "no" if input.x\n'


@pytest.fixture
def policies(backend: Any) -> Any:
    return narrow(backend, PolicyBindings)


def test_push_replace_and_remove_a_projects_bundle(backend: Any, policies: Any) -> None:
    assert policies.policy_of("acme") is None
    one = PolicyBundle(modules={"a.rego": MODULE})
    uses = MODULE.replace("import rego.v1", "import data.stackflow.lib")
    two = PolicyBundle(modules={"a.rego": uses, "lib/b.rego": "package stackflow.lib\n"})
    first = store_bundle(backend, one)
    assert first == one.digest and store_bundle(backend, one) == first  # content-addressed
    policies.bind_policy("acme", first, by="alice")
    found = policies.policy_of("acme")
    assert (found.project, found.digest, found.updated_by) == ("acme", first, "alice")
    assert found.updated_at.tzinfo is not None
    second = store_bundle(backend, two)
    policies.bind_policy("acme", second, by="bob")
    assert policies.policy_of("acme").digest == second
    assert fetch_bundle(backend, second) == two
    assert policies.policy_of("other") is None
    assert policies.unbind_policy("acme") is True
    assert policies.unbind_policy("acme") is False
    assert policies.policy_of("acme") is None


def test_a_digest_that_is_not_one_is_refused(policies: Any) -> None:
    with pytest.raises(SpecError):
        policies.bind_policy("acme", "sha256:short")
