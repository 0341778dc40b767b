"""Every backend satisfies every protocol of the state interface (the conformance files beside this
one test each protocol's behaviour)."""

from __future__ import annotations

import pytest

from stackflow.state.backend import StateBackend
from stackflow.state.protocols import STATE_PROTOCOLS


@pytest.mark.parametrize("protocol", STATE_PROTOCOLS, ids=lambda p: p.__name__)
def test_backend_satisfies(backend: StateBackend, protocol: type) -> None:
    assert isinstance(backend, protocol)


def test_protocols_cover_every_public_method_once() -> None:
    """The protocols split the backend's public methods with nothing left over or shared."""
    methods = [
        name
        for protocol in STATE_PROTOCOLS
        for name in vars(protocol)
        if not name.startswith("_") and callable(getattr(protocol, name))
    ]
    public = {
        name
        for name in dir(StateBackend)
        if not name.startswith("_") and callable(getattr(StateBackend, name))
    }
    assert len(methods) == len(set(methods))
    assert set(methods) == public
