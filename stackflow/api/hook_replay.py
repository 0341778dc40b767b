"""Replayed webhook deliveries start nothing.

A delivery is authenticated by its HMAC alone, so a captured one verifies forever; within
the API's 24-hour ``Idempotency-Key`` window its run is found again, after it a replay would
start a new run of an old commit. So before a delivery starts a run of a stack, the API
fetches the bound branch (the API's own git cache, bounded like the worker's fetches:
:mod:`stackflow.state.git_pack`; ``STACKFLOW_GIT_CREDENTIALS`` for a private repository) and
the commit must be the branch's head, or on it and newer than the commit the stack's last
delivery ran (recorded in the state backend, :meth:`record_push`). A redelivery of that last
commit within the window is let through: it finds the same run and starts nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

from stackflow.api.context import ApiContext
from stackflow.api.runs import IDEMPOTENCY_WINDOW
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef
from stackflow.model.source import GitSource, same_repository
from stackflow.state.git_sources import SourceUnavailable, git_cache, push_refusal


async def replay_refusal(
    ctx: ApiContext, stack: StackRef, source: GitSource, commit: str
) -> str | None:
    """Why a delivery of ``commit`` must not start ``stack``'s run (None: it may)."""
    last = await ctx.state(lambda: ctx.backend.last_push(stack))
    if last is not None and not same_repository(last.url, source.url):
        last = None  # bound to another repository since
    if (
        last is not None
        and last.commit == commit
        and datetime.now(UTC) - last.at < IDEMPOTENCY_WINDOW
    ):
        return None  # a redelivery within the key window: that run, nothing new
    previous = last.commit if last is not None else None
    try:
        return await ctx.state(
            lambda: push_refusal(source.url, source.ref, commit, previous, git_cache())
        )
    except (SpecError, SourceUnavailable) as err:
        return f"cannot check that {commit[:12]} is the head of {source.branch_ref}: {err}"


async def record_push(ctx: ApiContext, stack: StackRef, source: GitSource, commit: str) -> None:
    """A delivery started a run of ``commit``: later ones must be newer, or the head."""
    await ctx.state(lambda: ctx.backend.record_push(stack, source.url, commit))
