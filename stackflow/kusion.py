"""Kusion compatibility: read ``~/.kusion/releases/<project>/<workspace>/`` and import it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stackflow.errors import ConflictError, KusionFormatError
from stackflow.release import Release, ReleaseStore
from stackflow.spec import load_yaml

METADATA_FILE = ".metadata.yml"


class KusionReleaseMeta(BaseModel):
    revision: int
    stack: str | None = None


class KusionMetadata(BaseModel):
    """Kusion's per-workspace index of releases."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    latest_revision: int = Field(alias="latestRevision")
    releases: list[KusionReleaseMeta] = Field(default_factory=list, alias="releaseMetaDatas")


def _first_error(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "<top level>"
    return f"{where}: {first['msg']}"


def _read_yaml(path: Path) -> Any:
    try:
        return load_yaml(path.read_bytes())
    except OSError as err:
        raise KusionFormatError(f"{path}: cannot read: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise KusionFormatError(f"{path}: invalid YAML: {' '.join(str(err).split())}") from err


def load_kusion_metadata(path: Path) -> KusionMetadata:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise KusionFormatError(
            f"{path}: malformed Kusion release metadata: expected a mapping with "
            f"latestRevision and releaseMetaDatas, got {type(data).__name__}"
        )
    try:
        return KusionMetadata.model_validate(data)
    except ValidationError as err:
        raise KusionFormatError(
            f"{path}: malformed Kusion release metadata: {_first_error(err)}"
        ) from err


def load_kusion_release(path: Path) -> Release:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise KusionFormatError(f"{path}: a Kusion release is a mapping")
    try:
        return Release.model_validate(data)
    except ValidationError as err:
        raise KusionFormatError(f"{path}: invalid Kusion release: {_first_error(err)}") from err


def read_kusion_stack(directory: Path) -> list[Release]:
    """Every release of one ``<project>/<workspace>`` directory, by revision.

    With a ``.metadata.yml`` the revisions it lists are read (and must exist); without one
    every ``<n>.yaml`` is.
    """
    meta_path = directory / METADATA_FILE
    if meta_path.exists():
        meta = load_kusion_metadata(meta_path)
        revisions = sorted(m.revision for m in meta.releases)
        if revisions and meta.latest_revision != revisions[-1]:
            raise KusionFormatError(
                f"{meta_path}: latestRevision {meta.latest_revision} is not the last "
                f"listed revision {revisions[-1]}"
            )
    else:
        revisions = sorted(int(p.stem) for p in directory.glob("*.yaml") if p.stem.isdigit())
    releases = []
    for rev in revisions:
        path = directory / f"{rev}.yaml"
        release = load_kusion_release(path)
        if (release.project, release.workspace, release.revision) != (
            directory.parent.name,
            directory.name,
            rev,
        ):
            raise KusionFormatError(
                f"{path}: holds {release.project}/{release.workspace} revision "
                f"{release.revision}, not {directory.parent.name}/{directory.name} revision {rev}"
            )
        releases.append(release)
    return releases


def find_kusion_stacks(kusion_home: Path) -> list[Path]:
    """``<kusion_home>/releases/<project>/<workspace>`` directories, sorted."""
    root = Path(kusion_home).expanduser() / "releases"
    if not root.is_dir():
        raise KusionFormatError(f"{root}: no Kusion releases directory")
    projects = [p for p in root.iterdir() if p.is_dir()]
    return sorted(ws for p in projects for ws in p.iterdir() if ws.is_dir())


def import_kusion_releases(kusion_home: Path | str, release_store: ReleaseStore) -> dict[str, int]:
    """Import every Kusion release under ``kusion_home``; returns ``{project/workspace: count}``.

    Everything is read and checked first, and nothing is written if any target stack already
    has releases, so a refused import leaves the store as it was.
    """
    stacks = {d: read_kusion_stack(d) for d in find_kusion_stacks(Path(kusion_home))}
    for directory in stacks:
        project, workspace = directory.parent.name, directory.name
        if release_store.revisions(project, workspace):
            raise ConflictError(
                f"stack {project}/{workspace} already has stackflow releases; "
                "import only into stacks with none"
            )
    imported: dict[str, int] = {}
    for directory, releases in stacks.items():
        for release in releases:
            release_store.import_release(release)
        imported[f"{directory.parent.name}/{directory.name}"] = len(releases)
    return imported
