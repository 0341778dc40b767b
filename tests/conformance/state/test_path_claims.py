"""State conformance, PathClaims: which stack owns each OnPrem path. A path is one stack's
(another's claim or lookup names the owner), fenced on the run that holds the claimer's
stack, given up by a delete, taken over once stale (its owner holds no run and no longer
records it), and of two stacks claiming one path at once exactly one wins. Every backend
(SQLite and PostgreSQL) passes it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stackflow.core.errors import FencedError
from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Phase
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import PathClaims, ReleaseWriter, StackLocks
from tests.conformance.state.common import narrow, res

X, Y = StackRef("team-x", "prod"), StackRef("team-y", "prod")
RX, RY = RunRef("stackflow/team-x/prod", "rx"), RunRef("stackflow/team-y/prod", "ry")
P = "/srv/site/index.html"


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    return narrow(backend, PathClaims, StackLocks, ReleaseWriter)


def test_a_path_is_one_stacks_and_a_delete_gives_it_up(backend: Any) -> None:
    backend.create(X, Operation.apply, run=RX)
    backend.create(Y, Operation.apply, run=RY)
    assert backend.claim_paths(X, {P: "onprem:File:x"}, revision=1, run=RX) == {}
    assert backend.claim_paths(X, {P: "onprem:File:x"}, revision=1, run=RX) == {}  # again
    held = backend.claim_paths(Y, {P: "onprem:File:y", "/srv/y": "y2"}, revision=1, run=RY)
    assert list(held) == [P] and held[P].stack == X and held[P].resource_id == "onprem:File:x"
    assert backend.path_owners(Y, [P, "/srv/y", "/srv/none"]).keys() == {P}
    assert backend.path_owners(X, [P]) == {}
    assert backend.path_owners(X, ["/srv/y"])["/srv/y"].stack == Y  # the other path was claimed
    backend.release_paths(Y, [P], revision=1, run=RY)  # not Y's: nothing happens
    assert backend.path_owners(Y, [P])[P].stack == X
    backend.release_paths(X, [P], revision=1, run=RX)
    assert backend.claim_paths(Y, {P: "onprem:File:y"}, revision=1, run=RY) == {}
    assert backend.path_owners(X, [P])[P].stack == Y


def test_claims_are_fenced_on_the_run_that_holds_the_stack(backend: Any) -> None:
    backend.create(X, Operation.apply, run=RX)
    with pytest.raises(FencedError):
        backend.claim_paths(X, {P: "x"}, revision=1, run=RY)
    assert backend.path_owners(Y, [P]) == {}
    with pytest.raises(FencedError):
        backend.release_paths(X, [P], revision=1, run=RY)


def test_a_recorded_path_stays_its_owners_and_a_stale_claim_is_taken_over(backend: Any) -> None:
    backend.create(X, Operation.apply, run=RX)
    backend.claim_paths(X, {P: "onprem:File:x", "/srv/lost": "lost"}, revision=1, run=RX)
    backend.record_resource(X, 1, res("onprem:File:x", kind="File", path=P), run=RX)
    backend.set_phase(X, 1, Phase.succeeded, run=RX)  # the run ends: X's lock is free
    backend.create(Y, Operation.apply, run=RY)
    held = backend.claim_paths(Y, {P: "y", "/srv/lost": "y2"}, revision=1, run=RY)
    # X records P: still X's; X never recorded "lost" (its apply failed before): stale
    assert list(held) == [P] and held[P].stack == X
    assert backend.path_owners(X, ["/srv/lost"])["/srv/lost"].stack == Y


def test_of_two_stacks_claiming_one_path_at_once_exactly_one_wins(backend: Any) -> None:
    paths = {f"/srv/shared/f{i:03}": f"r{i}" for i in range(50)}
    backend.create(X, Operation.apply, run=RX)
    backend.create(Y, Operation.apply, run=RY)
    start = threading.Barrier(2)
    results: dict[StackRef, dict[str, Any]] = {}

    def claim(stack: StackRef, run: RunRef) -> None:
        start.wait()
        results[stack] = backend.claim_paths(stack, paths, revision=1, run=run)

    threads = [threading.Thread(target=claim, args=(s, r)) for s, r in ((X, RX), (Y, RY))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    refused_x, refused_y = set(results[X]), set(results[Y])
    assert refused_x | refused_y == set(paths) and not refused_x & refused_y
    for path in paths:
        owner = X if path in refused_y else Y
        assert backend.path_owners(Y if owner == X else X, [path])[path].stack == owner


def test_the_migration_claims_the_paths_each_stacks_latest_release_records(
    tmp_path: Any,
) -> None:
    """An existing database: the migration to 0011 gives each stack the OnPrem paths its
    latest release records (the first stack found keeps a path two record)."""
    import json

    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from stackflow.state.backend import open_backend
    from stackflow.state.models import MIGRATIONS
    from stackflow.state.schema import onprem_paths, release_resources, releases

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0009")

    def body(rid: str, path: str, kind: str = "OnPrem") -> str:
        doc = {"id": rid, "type": kind, "attributes": {"kind": "File", "path": path}}
        return json.dumps(doc, separators=(",", ":"))

    rows = [  # (stack, revision, resource id, body)
        (X, 1, "old", body("old", "/srv/old")),  # revision 1: not the latest
        (X, 2, "x", body("x", "/srv//x")),
        (X, 2, "cm", body("cm", "/srv/cm", "Kubernetes")),
        (Y, 1, "y", body("y", "/srv/x")),  # Y records X's path too: X was first
        (Y, 1, "y2", body("y2", "/srv/y")),
    ]
    stamp = sa.func.now()
    with engine.begin() as conn:
        for stack, rev in {(s, r) for s, r, _, _ in rows}:
            conn.execute(
                releases.insert().values(
                    project=stack.project,
                    workspace=stack.workspace,
                    revision=rev,
                    operation="apply",
                    phase="succeeded",
                    created_at=stamp,
                    modified_at=stamp,
                )
            )
        for n, (stack, rev, rid, text) in enumerate(rows):
            conn.execute(
                release_resources.insert().values(
                    project=stack.project,
                    workspace=stack.workspace,
                    revision=rev,
                    resource_id=rid,
                    position=n,
                    body=text,
                )
            )
    engine.dispose()
    backend = open_backend(url, migrate=True)
    try:
        with backend.engine.connect() as conn:
            claims = {
                row.path: (row.project, row.resource_id)
                for row in conn.execute(sa.select(onprem_paths))
            }
        assert claims == {"/srv/x": ("team-x", "x"), "/srv/y": ("team-y", "y2")}
        assert backend.path_owners(Y, ["/srv/x"])["/srv/x"].stack == X
    finally:
        backend.close()
