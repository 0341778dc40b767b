"""Kusion's real release files load as they are, and import into stackflow."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from stackflow.diff import Action, diff_resource
from stackflow.errors import ConflictError, KusionFormatError
from stackflow.kusion import (
    import_kusion_releases,
    load_kusion_metadata,
    load_kusion_release,
    read_kusion_stack,
)
from stackflow.release import Operation, Phase, ReleaseStore

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


def test_import_then_latest_succeeded_is_kusions_revision_3(release_store: ReleaseStore) -> None:
    assert import_kusion_releases(KUSION_HOME, release_store) == {"test_project/test_ws": 3}
    latest = release_store.latest_succeeded("test_project", "test_ws")
    assert latest is not None and latest.revision == 3 and latest.stack == "test_stack"
    kusion3 = load_kusion_release(STACK_DIR / "3.yaml")
    assert latest.state == kusion3.state
    assert [r.revision for r in release_store.list("test_project", "test_ws")] == [1, 2, 3]
    # the next apply continues from Kusion's last state and diffs against it
    nxt = release_store.create("test_project", "test_ws", Operation.apply, kusion3.spec)
    assert nxt.revision == 4 and nxt.state == kusion3.state
    prior = latest.state.by_id()[PTR].attributes
    desired = kusion3.spec.resources[0].attributes  # type: ignore[union-attr]
    assert diff_resource(PTR, "Kubernetes", desired, prior, prior).action is Action.UnChanged


def test_import_refuses_when_stack_has_releases(release_store: ReleaseStore) -> None:
    release_store.create("test_project", "test_ws", Operation.apply, None)
    with pytest.raises(ConflictError, match="test_project/test_ws already has stackflow releases"):
        import_kusion_releases(KUSION_HOME, release_store)
    assert release_store.revisions("test_project", "test_ws") == [1]


def test_import_checks_everything_before_writing(
    tmp_path: Path, release_store: ReleaseStore
) -> None:
    home = tmp_path / "kusion"
    shutil.copytree(KUSION_HOME / "releases", home / "releases")
    broken = home / "releases" / "zz_project" / "ws"
    broken.mkdir(parents=True)
    shutil.copy(INVALID, broken / ".metadata.yml")
    with pytest.raises(KusionFormatError, match=r"zz_project/ws/\.metadata\.yml"):
        import_kusion_releases(home, release_store)
    assert release_store.revisions("test_project", "test_ws") == []


def test_missing_releases_dir(tmp_path: Path, release_store: ReleaseStore) -> None:
    with pytest.raises(KusionFormatError, match="no Kusion releases directory"):
        import_kusion_releases(tmp_path, release_store)
