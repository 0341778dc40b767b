"""Releases and outputs through the API, as the objects the release commands render:
sensitive values come masked by the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackflow.cli.api_mode import api_client
from stackflow.core.errors import NotFoundError
from stackflow.core.refs import StackRef
from stackflow.engine.release_diff import ReleaseDiff
from stackflow.model.release import Release


def list_releases(stack: StackRef) -> list[Release]:
    """The stack's releases, oldest first (as the state backend lists them), without state."""
    with api_client() as client:
        found = client.releases(stack)
    return sorted((Release.model_validate(r) for r in found), key=lambda r: r.revision)


def release(stack: StackRef, revision: int | None) -> Release | None:
    """Release ``revision`` (default: the latest; None when the stack has none), masked."""
    with api_client() as client:
        if revision is None:
            listed = client.releases(stack)
            if not listed:
                return None
            revision = max(int(r["revision"]) for r in listed)
        data: dict[str, Any] = client.release(stack, revision)
    return Release.model_validate(data)


def latest(stack: StackRef) -> Release:
    found = release(stack, None)
    if found is None:
        raise NotFoundError(f"stack {stack} has no releases")
    return found


def release_diff(stack: StackRef, old: int, new: int) -> ReleaseDiff:
    with api_client() as client:
        return ReleaseDiff.model_validate(client.release_diff(stack, old, new))


def import_stacks(stacks: dict[StackRef, list[Release]]) -> dict[str, int]:
    """Import the releases read from local files, a project per request; as directly,
    nothing is written if any of the stacks already has releases."""
    from stackflow.api.models import ReleaseImport, ReleaseImported
    from stackflow.state.kusion import refuse_stacks_with_releases

    imported: dict[str, int] = {}
    with api_client() as client:
        refuse_stacks_with_releases(stacks, lambda stack: bool(client.releases(stack)))
        projects: dict[str, list[Release]] = {}
        for stack, releases in stacks.items():
            projects.setdefault(stack.project, []).extend(releases)
        for project, releases in projects.items():
            if not releases:
                continue
            answer = client.import_releases(project, ReleaseImport(releases=releases))
            done = ReleaseImported.model_validate(answer)
            imported.update(done.imported)
    return {str(stack): imported.get(str(stack), 0) for stack in stacks}


def export_stacks(directory: Path, project: str, workspace: str | None) -> dict[str, int]:
    """Write the project's (or one workspace's) releases as ``stackflow release export``
    does directly, from what the API serves."""
    from stackflow.api.models import ReleaseExport
    from stackflow.state.kusion import write_kusion_stack

    with api_client() as client:
        found = ReleaseExport.model_validate(client.export_releases(project, workspace))
    written: dict[str, int] = {}
    for stack in found.stacks:
        ref = StackRef(stack.project, stack.workspace)
        count = write_kusion_stack(directory, ref, stack.releases)
        if count:
            written[str(ref)] = count
    return written
