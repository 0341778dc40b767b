"""Releases and outputs from the state backend, every value through
:func:`stackflow.engine.masking.masked_release_data` (sensitive values never served)."""

from __future__ import annotations

from typing import Any

from stackflow.api.context import ApiContext
from stackflow.core.errors import NotFoundError, SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.masking import masked_release_data
from stackflow.model.release import Release
from stackflow.state.backend import StateBackend

LISTED = ("spec", "state", "changes")
"""Left out of a listing (``…/releases/{revision}`` has them)."""


def summary(release: Release) -> dict[str, Any]:
    data = release.model_dump(mode="json", exclude=set(LISTED))
    data["resource_count"] = release.resource_count
    return data


async def list_releases(ctx: ApiContext, stack: StackRef) -> list[dict[str, Any]]:
    releases = await ctx.state(lambda: ctx.backend.list(stack))
    return [summary(r) for r in sorted(releases, key=lambda r: r.revision, reverse=True)]


def readable(backend: StateBackend, stack: StackRef, revision: int | None) -> Release | None:
    """Release ``revision`` (None: the latest) to be shown masked. An encrypted spec when
    this process has no keys is left out: the state's sealed values stay sealed anyway, and
    the paths its apply recorded as tainted are masked as always."""
    try:
        if revision is None:
            return backend.latest(stack)
        return backend.get(stack, revision)
    except SpecError:
        if backend.keys is not None:
            raise
    if revision is None:
        return backend.latest(stack, with_spec=False)
    return backend.get(stack, revision, with_spec=False)


async def one_release(ctx: ApiContext, stack: StackRef, revision: int) -> dict[str, Any]:
    release = await ctx.state(lambda: readable(ctx.backend, stack, revision))
    if release is None:
        raise NotFoundError(f"release {revision} of {stack} does not exist")
    return masked_release_data(release)


async def outputs(ctx: ApiContext, stack: StackRef) -> dict[str, Any]:
    """The latest release's recorded attributes per resource id, masked."""
    latest = await ctx.state(lambda: readable(ctx.backend, stack, None))
    if latest is None:
        raise NotFoundError(f"stack {stack} has no releases")
    data = masked_release_data(latest)
    resources = (data.get("state") or {}).get("resources") or []
    return {
        "project": stack.project,
        "workspace": stack.workspace,
        "revision": latest.revision,
        "phase": latest.phase,
        "outputs": {r["id"]: r.get("attributes") or {} for r in resources},
    }


def _span(revisions: list[int]) -> str:
    """``1-5`` for a run of revisions, else each one."""
    if revisions == list(range(revisions[0], revisions[-1] + 1)):
        return f"{revisions[0]}-{revisions[-1]}" if len(revisions) > 1 else str(revisions[0])
    return ", ".join(map(str, revisions))


async def release_diff(ctx: ApiContext, stack: StackRef, old: int, new: int) -> dict[str, Any]:
    """What changed from release ``old`` to ``new`` (spec and recorded state), sensitive
    values masked on both sides: ``stackflow release diff --output json``."""
    from stackflow.engine.release_diff import diff_releases

    def load() -> tuple[Release, Release]:
        revisions = ctx.backend.revisions(stack)
        if not revisions:
            raise NotFoundError(f"stack {stack} has no releases")
        for revision in dict.fromkeys((old, new)):
            if revision not in revisions:
                raise NotFoundError(
                    f"release {revision} of {stack} does not exist (revisions {_span(revisions)})"
                )
        before = ctx.backend.get(stack, old)
        return before, before if new == old else ctx.backend.get(stack, new)

    before, after = await ctx.state(load)
    found = diff_releases(
        stack, old, before.spec, before.state.resources, new, after.spec, after.state.resources
    )
    data: dict[str, Any] = found.model_dump(mode="json")
    return data
