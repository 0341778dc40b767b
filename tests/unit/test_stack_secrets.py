"""StackSecrets: the sensitive values of a stack's prior state, read once per revision."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from stackflow.activities.resource_step import StackSecrets
from stackflow.core.refs import StackRef
from stackflow.model.spec import Resource

STACK = StackRef("secrets", "dev")
SECRET = Resource.model_validate(
    {
        "id": "v1:Secret:ns:db",
        "type": "Kubernetes",
        "attributes": {"apiVersion": "v1", "kind": "Secret", "data": {"password": "aHVudGVyMg=="}},
    }
)


def test_batches_that_start_together_read_the_state_once() -> None:
    """Eight batches of a run ask at once: one reads the prior state (it took 156 MB at
    once per batch for 50,000 files), the others wait for it and get the same set."""
    asked: list[int] = []
    reads: list[StackRef] = []
    release = threading.Event()

    def latest_succeeded_revision(stack: StackRef) -> int:
        asked.append(1)
        return 3

    def each_prior(stack: StackRef) -> Iterator[Resource]:
        reads.append(stack)
        release.wait(10)
        yield SECRET

    deps: Any = SimpleNamespace(
        backend=SimpleNamespace(latest_succeeded_revision=latest_succeeded_revision),
        cache=SimpleNamespace(each_prior=each_prior),
    )
    secrets = StackSecrets(deps)
    with ThreadPoolExecutor(8) as pool:
        asking = [pool.submit(secrets.of, STACK) for _ in range(8)]
        deadline = time.monotonic() + 10
        while len(asked) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # each past its revision read, on its way to the state
        release.set()
        found = [f.result(timeout=10) for f in asking]
    assert reads == [STACK]
    assert all(f is found[0] for f in found)
    assert "aHVudGVyMg==" in found[0]
    assert secrets.of(STACK) is found[0] and reads == [STACK]  # remembered for revision 3
