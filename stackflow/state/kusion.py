"""Kusion compatibility: read ``~/.kusion/releases/<project>/<workspace>/`` and import it;
export releases back into that layout."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stackflow.core.errors import ConflictError, KusionFormatError
from stackflow.core.refs import StackRef
from stackflow.engine.masking import masked_release_data
from stackflow.engine.spec import load_yaml
from stackflow.model.release import Release

if TYPE_CHECKING:
    from stackflow.state.backend import StateBackend

METADATA_FILE = ".metadata.yml"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


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
                f"{path}: holds {release.stack_ref} revision "
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


def read_kusion_home(kusion_home: Path | str) -> dict[StackRef, list[Release]]:
    """Every Kusion release under ``kusion_home``, read and checked, by stack."""
    return {
        StackRef(d.parent.name, d.name): read_kusion_stack(d)
        for d in find_kusion_stacks(Path(kusion_home))
    }


def refuse_stacks_with_releases(stacks: Iterable[StackRef], has_releases: Any) -> None:
    """ConflictError naming the first of ``stacks`` that ``has_releases(stack)`` says
    already has releases: an import goes only into stacks with none."""
    for stack in stacks:
        if has_releases(stack):
            raise ConflictError(
                f"stack {stack} already has stackflow releases; import only into stacks with none"
            )


def check_import(releases: Iterable[Release]) -> dict[StackRef, list[Release]]:
    """Releases to import, by stack and revision; KusionFormatError when a stack holds one
    revision twice."""
    stacks: dict[StackRef, list[Release]] = {}
    for release in releases:
        stacks.setdefault(release.stack_ref, []).append(release)
    for stack, found in stacks.items():
        found.sort(key=lambda r: r.revision)
        revisions = [r.revision for r in found]
        twice = sorted({r for r in revisions if revisions.count(r) > 1})
        if twice:
            raise KusionFormatError(
                f"stack {stack}: revision {twice[0]} is given more than once; not imported"
            )
    return stacks


def import_stacks(
    stacks: dict[StackRef, list[Release]], release_store: StateBackend
) -> dict[str, int]:
    """Import ``stacks``' releases; returns ``{project/workspace: count}``. Everything is
    checked first, and nothing is written if any target stack already has releases, so a
    refused import leaves the store as it was."""
    refuse_stacks_with_releases(stacks, release_store.revisions)
    imported: dict[str, int] = {}
    for stack, releases in stacks.items():
        for release in releases:
            release_store.import_release(release)
        imported[str(stack)] = len(releases)
    return imported


def import_kusion_releases(kusion_home: Path | str, release_store: StateBackend) -> dict[str, int]:
    """Import every Kusion release under ``kusion_home``; returns ``{project/workspace: count}``
    (nothing is written if any target stack already has releases)."""
    return import_stacks(read_kusion_home(kusion_home), release_store)


def _kusion_document(release: Release) -> dict[str, Any]:
    """A release in Kusion's file form, sensitive values masked."""
    data = masked_release_data(release)
    doc: dict[str, Any] = {
        "project": release.project,
        "workspace": release.workspace,
        "revision": release.revision,
        "stack": release.stack or release.project,
        "spec": data.get("spec") or {"resources": []},
        "state": data.get("state") or {"resources": []},
        "phase": release.phase.value,
        "createTime": release.created_at.isoformat(),
        "modifiedTime": release.modified_at.isoformat(),
    }
    return doc


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def kusion_documents(backend: StateBackend, stack: StackRef) -> list[dict[str, Any]]:
    """The stack's releases in Kusion's file form, by revision, sensitive values masked."""
    return [_kusion_document(backend.get(stack, rev)) for rev in backend.revisions(stack)]


def check_directory_names(stack: StackRef) -> None:
    for name in (stack.project, stack.workspace):
        if not _SAFE_NAME.match(name):
            raise KusionFormatError(
                f"stack {stack}: {name!r} cannot be a directory name; not exported"
            )


def write_kusion_stack(directory: Path, stack: StackRef, documents: list[dict[str, Any]]) -> int:
    """Write ``documents`` (:func:`kusion_documents`) as ``releases/<project>/<workspace>/
    <n>.yaml`` and ``.metadata.yml`` under ``directory``, files 0600; returns how many."""
    check_directory_names(stack)
    target = directory / "releases" / stack.project / stack.workspace
    metas = []
    for doc in documents:
        revision = doc["revision"]
        _write_private(target / f"{revision}.yaml", yaml.safe_dump(doc, sort_keys=False))
        metas.append({"revision": revision, "stack": doc["stack"]})
    if metas:
        meta = {"latestRevision": metas[-1]["revision"], "releaseMetaDatas": metas}
        _write_private(target / METADATA_FILE, yaml.safe_dump(meta, sort_keys=False))
    return len(metas)


def selected_stacks(
    backend: StateBackend, project: str | None = None, workspace: str | None = None
) -> list[StackRef]:
    return [
        stack
        for stack in backend.stacks()
        if not (project and stack.project != project)
        and not (workspace and stack.workspace != workspace)
    ]


def export_kusion_releases(
    backend: StateBackend,
    directory: Path,
    project: str | None = None,
    workspace: str | None = None,
) -> dict[str, int]:
    """Write ``releases/<project>/<workspace>/<n>.yaml`` and ``.metadata.yml`` as Kusion
    does, for the stacks selected; returns ``{project/workspace: count}``."""
    written: dict[str, int] = {}
    for stack in selected_stacks(backend, project, workspace):
        check_directory_names(stack)
        count = write_kusion_stack(directory, stack, kusion_documents(backend, stack))
        if count:
            written[str(stack)] = count
    return written
