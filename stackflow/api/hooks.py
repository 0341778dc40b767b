"""Inbound webhooks: a push to a bound branch starts a run of the pushed commit, exactly once.

``POST /v1/hooks/github`` takes GitHub's ``push`` event. It is authenticated by its
``X-Hub-Signature-256`` (HMAC-SHA256 of the raw body) against the secret of every stack bound
to the pushed repository, compared in constant time; a stack whose secret does not verify
the delivery is not touched, and a delivery no secret verifies is a 401 that starts nothing.
For each stack it verifies: a push to another branch, a branch deletion, or commits that do
not touch the spec file are ignored, saying why; otherwise the stack's run (apply or preview,
per binding) of the pushed commit starts with the Idempotency-Key ``git:<commit>``, so a
redelivery of the same delivery, concurrent or later, and the same commit pushed again, are
that one run (within the API's 24-hour key window).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from pydantic import BaseModel, Field

from stackflow.api import runs
from stackflow.api.context import ApiContext
from stackflow.api.models import RunOperation, RunRequest
from stackflow.api.problems import Problem
from stackflow.errors import StackLockedError
from stackflow.refs import StackRef
from stackflow.sources import COMMIT, GitSource, SourceMode

ZERO = "0" * 40


class HookRun(BaseModel):
    project: str
    workspace: str
    run_id: str
    workflow_id: str
    operation: RunOperation
    created: bool
    status_url: str
    events_url: str


class HookSkip(BaseModel):
    project: str
    workspace: str
    reason: str


class HookResult(BaseModel):
    """What a delivery did, per bound stack it was signed for."""

    delivery: str | None = None
    commit: str | None = None
    runs: list[HookRun] = Field(default_factory=list)
    ignored: list[HookSkip] = Field(default_factory=list)


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (``sha256=<hex>``) is the HMAC-SHA256 of ``body`` with ``secret``."""
    if not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header[len("sha256=") :].strip().lower())


def _payload(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Problem(
            400, "the body is not JSON (send the push event as application/json)"
        ) from None
    if not isinstance(data, dict):
        raise Problem(422, "the body is not a GitHub push event (a JSON object)")
    return data


def _repository_urls(data: dict[str, Any]) -> list[str]:
    repo = data.get("repository")
    if not isinstance(repo, dict):
        raise Problem(422, "repository: missing (not a GitHub push event)")
    urls = [repo.get(k) for k in ("clone_url", "html_url", "url")]
    found = [u for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]
    if not found:
        raise Problem(422, "repository.clone_url: missing (not a GitHub push event)")
    return found


def _touches(data: dict[str, Any], path: str) -> bool:
    """Whether the pushed commits change ``path`` (True when the event does not list files,
    as for a push of more commits than GitHub lists)."""
    commits = data.get("commits")
    if not isinstance(commits, list) or not commits:
        return True
    for commit in commits:
        if not isinstance(commit, dict):
            return True
        for key in ("added", "modified", "removed"):
            files = commit.get(key)
            if isinstance(files, list) and path in files:
                return True
    return False


async def github_push(
    ctx: ApiContext,
    body: bytes,
    *,
    event: str | None,
    delivery: str | None,
    signature: str | None,
) -> tuple[int, HookResult]:
    """What a GitHub delivery does; (HTTP status, result)."""
    data = _payload(body)
    urls = _repository_urls(data)
    bound: dict[StackRef, GitSource] = {}

    def sources() -> list[tuple[StackRef, GitSource]]:
        return [pair for url in urls for pair in ctx.backend.sources_of_repository(url)]

    for stack, source in await ctx.state(sources):
        bound.setdefault(stack, source)
    signed = {s: src for s, src in bound.items() if signature_ok(src.secret, body, signature)}
    if not signed:
        raise Problem(
            401,
            "X-Hub-Signature-256 does not match the secret of any stack bound to this "
            "repository (or none is bound): nothing started",
            "bad-signature",
        )
    result = HookResult(delivery=(delivery or "")[:100] or None)
    if event == "ping":
        return 200, result
    if event != "push":
        for stack in signed:
            result.ignored.append(
                HookSkip(**_names(stack), reason=f"event {str(event)[:40]!r} starts nothing")
            )
        return 202, result
    ref, commit = data.get("ref"), data.get("after")
    if not isinstance(commit, str) or not (COMMIT.match(commit) or commit == ZERO):
        raise Problem(422, "after: not a commit id (40 hex digits)")
    result.commit = commit
    pusher = data.get("pusher")
    name = pusher.get("name") if isinstance(pusher, dict) else None
    who = "github:" + "".join(c for c in str(name or "push")[:150] if c.isprintable())
    for stack, source in sorted(signed.items(), key=lambda item: str(item[0])):
        reason = _skip(data, source, ref, commit)
        if reason is not None:
            result.ignored.append(HookSkip(**_names(stack), reason=reason))
            continue
        request = RunRequest(
            operation=RunOperation(source.mode.value),
            commit=commit,
            message=f"git push of {commit[:12]} to {source.branch_ref}",
        )
        if source.mode == SourceMode.apply and source.auto_approve:
            request.auto_approve = True
        try:
            started = await runs.start_run(ctx, stack, request, who, f"git:{commit}")
        except StackLockedError as err:
            result.ignored.append(HookSkip(**_names(stack), reason=str(err)))
            continue
        base = f"/v1/stacks/{stack.project}/{stack.workspace}/runs/{started.run_id}"
        result.runs.append(
            HookRun(
                **_names(stack),
                run_id=started.run_id,
                workflow_id=started.handle.id,
                operation=request.operation,
                created=started.created,
                status_url=base,
                events_url=base + "/events",
            )
        )
    if any(r.created for r in result.runs):
        return 201, result
    return (200 if result.runs else 202), result


def _names(stack: StackRef) -> dict[str, str]:
    return {"project": stack.project, "workspace": stack.workspace}


def _skip(data: dict[str, Any], source: GitSource, ref: Any, commit: str) -> str | None:
    if ref != source.branch_ref:
        return f"a push to {str(ref)[:200]}, not {source.branch_ref}"
    if data.get("deleted") or commit == ZERO:
        return f"{source.branch_ref} was deleted"
    if not _touches(data, source.path):
        return f"the pushed commits do not change {source.path}"
    return None
