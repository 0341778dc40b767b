"""Kusion's real release files load as they are, and import into stackflow."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from stackflow.core.errors import ConflictError, KusionFormatError
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.diff import Action, diff_resource
from stackflow.engine.masking import SENSITIVE_MARKER
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import Resource, ResourceType, Spec
from stackflow.state.backend import StateBackend
from stackflow.state.kusion import (
    export_kusion_releases,
    import_kusion_releases,
    load_kusion_metadata,
    load_kusion_release,
    read_kusion_stack,
)

KUSION_HOME = Path(__file__).resolve().parents[3] / "shared/compat/kusion/release/storages/testdata"
STACK_DIR = KUSION_HOME / "releases" / "test_project" / "test_ws"
INVALID = KUSION_HOME / "invalid_releases" / "test_project" / "test_ws" / ".metadata.yml"
PTR = "apps.kusionstack.io/v1alpha1:PodTransitionRule:fakeNs:default-dev-foo"


def test_the_three_releases_load() -> None:
    for rev in (1, 2, 3):
        release = load_kusion_release(STACK_DIR / f"{rev}.yaml")
        assert (release.project, release.workspace, release.revision) == (
            "test_project",
            "test_ws",
            rev,
        )
        assert release.stack == "test_stack"
        assert release.operation is Operation.apply  # Kusion records none: inferred
        assert release.phase is Phase.succeeded
        assert release.created_at == datetime(
            2024, 5, 10, 16, 48, tzinfo=timezone(timedelta(hours=8))
        )
        assert release.modified_at == release.created_at
        assert [r.id for r in release.state.resources] == [PTR]
        assert release.spec is not None and release.spec.resources[0].extensions["GVK"]


def test_metadata_index() -> None:
    meta = load_kusion_metadata(STACK_DIR / ".metadata.yml")
    assert meta.latest_revision == 3
    assert [(m.revision, m.stack) for m in meta.releases] == [
        (1, "test_stack"),
        (2, "test_stack"),
        (3, "test_stack"),
    ]
    assert [r.revision for r in read_kusion_stack(STACK_DIR)] == [1, 2, 3]


def test_malformed_metadata_rejected_in_one_line() -> None:
    with pytest.raises(KusionFormatError) as info:
        load_kusion_metadata(INVALID)
    message = str(info.value)
    assert message.startswith(str(INVALID)) and "malformed Kusion release metadata" in message
    assert "\n" not in message
    with pytest.raises(KusionFormatError, match="malformed"):
        read_kusion_stack(INVALID.parent)


def test_import_then_latest_succeeded_is_kusions_revision_3(backend: StateBackend) -> None:
    assert import_kusion_releases(KUSION_HOME, backend) == {"test_project/test_ws": 3}
    latest = backend.latest_succeeded(StackRef("test_project", "test_ws"))
    assert latest is not None and latest.revision == 3 and latest.stack == "test_stack"
    kusion3 = load_kusion_release(STACK_DIR / "3.yaml")
    assert latest.state == kusion3.state
    assert [r.revision for r in backend.list(StackRef("test_project", "test_ws"))] == [1, 2, 3]
    # the next apply continues from Kusion's last state and diffs against it
    nxt = backend.create(StackRef("test_project", "test_ws"), Operation.apply, kusion3.spec)
    assert nxt.revision == 4 and nxt.state == kusion3.state
    prior = latest.state.by_id()[PTR].attributes
    desired = kusion3.spec.resources[0].attributes  # type: ignore[union-attr]
    assert diff_resource(PTR, "Kubernetes", desired, prior, prior).action is Action.UnChanged


def test_import_refuses_when_stack_has_releases(backend: StateBackend) -> None:
    backend.create(StackRef("test_project", "test_ws"), Operation.apply, None)
    with pytest.raises(ConflictError, match="test_project/test_ws already has stackflow releases"):
        import_kusion_releases(KUSION_HOME, backend)
    assert backend.revisions(StackRef("test_project", "test_ws")) == [1]


def test_import_checks_everything_before_writing(tmp_path: Path, backend: StateBackend) -> None:
    home = tmp_path / "kusion"
    shutil.copytree(KUSION_HOME / "releases", home / "releases")
    broken = home / "releases" / "zz_project" / "ws"
    broken.mkdir(parents=True)
    shutil.copy(INVALID, broken / ".metadata.yml")
    with pytest.raises(KusionFormatError, match=r"zz_project/ws/\.metadata\.yml"):
        import_kusion_releases(home, backend)
    assert backend.revisions(StackRef("test_project", "test_ws")) == []


def test_missing_releases_dir(tmp_path: Path, backend: StateBackend) -> None:
    with pytest.raises(KusionFormatError, match="no Kusion releases directory"):
        import_kusion_releases(tmp_path, backend)


def test_export_round_trips_through_kusions_layout(tmp_path: Path, backend: StateBackend) -> None:
    import_kusion_releases(KUSION_HOME, backend)
    # a stackflow-made stack beside it: an apply with a Secret, then a destroy in progress
    secret = Resource(
        id="v1:Secret:ns:db",
        type=ResourceType.Kubernetes,
        attributes={"apiVersion": "v1", "kind": "Secret", "data": {"password": "aHVudGVyMg=="}},
    )
    run = RunRef("apply-mine-dev", "r1")
    backend.create(StackRef("mine", "dev"), Operation.apply, Spec(resources=[secret]), run=run)
    backend.record_resource(StackRef("mine", "dev"), 1, secret, run=run)
    backend.set_phase(StackRef("mine", "dev"), 1, Phase.succeeded, run=run)
    backend.create(
        StackRef("mine", "dev"), Operation.destroy, None, run=RunRef("destroy-mine-dev", "r2")
    )

    out = tmp_path / "export"
    written = export_kusion_releases(backend, out)
    assert written == {"mine/dev": 2, "test_project/test_ws": 3}

    # Kusion's own stack reads back as it was imported
    exported = read_kusion_stack(out / "releases" / "test_project" / "test_ws")
    original = read_kusion_stack(STACK_DIR)
    assert [r.revision for r in exported] == [1, 2, 3]
    for got, want in zip(exported, original, strict=True):
        assert (got.project, got.workspace, got.stack, got.phase) == (
            want.project,
            want.workspace,
            want.stack,
            want.phase,
        )
        assert got.state == want.state and got.spec == want.spec
        assert got.created_at == want.created_at and got.modified_at == want.modified_at
    meta = load_kusion_metadata(out / "releases" / "test_project" / "test_ws" / ".metadata.yml")
    assert meta.latest_revision == 3 and [m.stack for m in meta.releases] == ["test_stack"] * 3

    # ours too, with the secret masked in both spec and state, and no spec for the destroy
    mine = read_kusion_stack(out / "releases" / "mine" / "dev")
    assert [(r.revision, r.phase, r.stack) for r in mine] == [
        (1, Phase.succeeded, "mine"),
        (2, Phase.generating, "mine"),
    ]
    assert mine[0].state.resources[0].attributes["data"] == SENSITIVE_MARKER
    assert mine[0].spec is not None
    assert mine[0].spec.resources[0].attributes["data"] == SENSITIVE_MARKER
    assert mine[1].spec is not None and mine[1].spec.resources == []
    assert [r.id for r in mine[1].state.resources] == [secret.id]
    assert b"aHVudGVyMg" not in b"".join(p.read_bytes() for p in out.rglob("*.y*ml"))

    # every file is private to its owner
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) == 2 + 3 + 2  # two .metadata.yml and five releases
    assert {p.stat().st_mode & 0o777 for p in files} == {0o600}

    # a selection exports only its stacks, and a second export overwrites in place
    again = tmp_path / "again"
    assert export_kusion_releases(backend, again, project="mine") == {"mine/dev": 2}
    assert not (again / "releases" / "test_project").exists()
    assert export_kusion_releases(backend, again, project="mine") == {"mine/dev": 2}
    assert export_kusion_releases(backend, again, workspace="nope") == {}
