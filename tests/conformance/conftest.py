"""Fixtures of the runtime conformance suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.memory_install import memory_runtime_installed


@pytest.fixture(scope="module")
def memory_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The test-only Memory runtime, registered through the entry-point group."""
    with memory_runtime_installed(tmp_path_factory.mktemp("memory-runtime")):
        yield
