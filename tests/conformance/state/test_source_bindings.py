"""State conformance, SourceBindings: one git source per stack, replaced by a new binding,
found by repository URL, removed; the webhook secret is never stored in clear when keys are
configured. Every backend (SQLite and PostgreSQL) passes it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from stackflow.core.refs import StackRef
from stackflow.model.source import BoundSource, GitSource
from stackflow.state.protocols import SourceBindings
from tests.conformance.state.common import STACK, narrow

SECRET = "a-webhook-secret-of-some-length"


@pytest.fixture
def bindings(backend: Any) -> Any:
    return narrow(backend, SourceBindings)


def source(**changes: Any) -> GitSource:
    data = {"url": "https://example.com/acme/infra.git", "path": "spec.yaml", "secret": SECRET}
    return GitSource.model_validate({**data, **changes})


def bound(by: str | None, **changes: Any) -> BoundSource:
    """The binding as read back: the source and who bound it (the runs' requester)."""
    return BoundSource.model_validate({**source(**changes).model_dump(), "bound_by": by})


def test_bind_replace_find_unbind(bindings: Any) -> None:
    assert bindings.source_of(STACK) is None
    bindings.bind_source(STACK, source(), by="alice")
    assert bindings.source_of(STACK) == bound("alice")
    bindings.bind_source(STACK, source(ref="release", mode="preview"), by="bob")
    assert bindings.source_of(STACK) == bound("bob", ref="release", mode="preview")
    other = StackRef("p", "prod")
    bindings.bind_source(other, source(url="https://EXAMPLE.com/acme/infra/"))
    assert bindings.source_of(other) == bound(None, url="https://EXAMPLE.com/acme/infra/")
    bindings.bind_source(StackRef("q", "w"), source(url="https://example.com/acme/else.git"))
    found = bindings.sources_of_repository("https://example.com/acme/infra")
    assert [stack for stack, _ in found] == [other, STACK]  # in stack order
    assert bindings.unbind_source(STACK) is True
    assert bindings.unbind_source(STACK) is False
    assert bindings.source_of(STACK) is None


def test_the_secret_is_sealed_at_rest(tmp_path: Any) -> None:
    from stackflow.core.crypto import KeyRing, new_key_line
    from stackflow.state.backend import open_backend

    keys = KeyRing.parse(new_key_line("k1"), "test")
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}", keys=keys)
    try:
        backend.bind_source(STACK, source())
        with backend.engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT secret FROM stack_sources")).scalar_one()
        assert SECRET not in stored
        bound = backend.source_of(STACK)
        assert bound is not None and bound.secret == SECRET
    finally:
        backend.close()


def test_the_last_pushed_commit_is_kept_per_stack(bindings: Any) -> None:
    """What the API's replay check reads: the commit of the last run a delivery started."""
    assert bindings.last_push(STACK) is None
    bindings.record_push(STACK, "https://example.com/acme/infra.git", "a" * 40)
    bindings.record_push(STACK, "https://example.com/acme/infra.git", "b" * 40)
    bindings.record_push(StackRef("p", "prod"), "https://example.com/acme/infra.git", "c" * 40)
    last = bindings.last_push(STACK)
    assert (last.url, last.commit) == ("https://example.com/acme/infra.git", "b" * 40)
    assert last.at.tzinfo is not None
    assert bindings.last_push(StackRef("p", "prod")).commit == "c" * 40
