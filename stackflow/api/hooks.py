"""Inbound webhooks: a push to a bound branch starts a run of the pushed commit, exactly once.

``POST /v1/hooks/github`` takes GitHub's ``push`` event. It is authenticated by its
``X-Hub-Signature-256`` (HMAC-SHA256 of the raw body) against the secret of every stack bound
to the pushed repository, compared in constant time; a stack whose secret does not verify
the delivery is not touched, and a delivery no secret verifies is a 401 that starts nothing.
For each stack it verifies: a push to another branch, a branch deletion, or commits that do
not touch the spec file are ignored, saying why; otherwise the stack's run (apply or preview,
per binding) of the pushed commit starts with the Idempotency-Key ``git:<commit>``, so a
redelivery of the same delivery, concurrent or later, and the same commit pushed again, are
that one run (within the API's 24-hour key window). A delivery whose commit is neither the
branch's head nor newer than the last one a delivery ran for the stack (a captured delivery
replayed later) starts nothing: :mod:`stackflow.api.hook_replay`, a 409 ``stale-delivery``.
A set bound to the repository (kept as the binding of its stack ``@set/<name>``) starts one
set run of its set file at the commit instead: :mod:`stackflow.api.set_start`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from pydantic import BaseModel, Field

from stackflow.api import hook_replay, run_start, set_start
from stackflow.api.context import ApiContext
from stackflow.api.identity import Role
from stackflow.api.models import RunOperation, RunRequest
from stackflow.api.problems import Problem
from stackflow.core.errors import StackLockedError
from stackflow.core.refs import StackRef
from stackflow.model.source import COMMIT, BoundSource, GitSource, SourceMode

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


class Push(BaseModel):
    """A push, whichever hook told of it."""

    urls: list[str]
    ref: str | None
    commit: str
    changed: list[str] | None = None
    """The files the pushed commits change, when the event lists them."""
    deleted: bool = False
    who: str


def _github_changed(data: dict[str, Any]) -> list[str] | None:
    commits = data.get("commits")
    if not isinstance(commits, list) or not commits:
        return None  # not listed (GitHub lists at most 20 commits): assume it changed
    changed: list[str] = []
    for commit in commits:
        if not isinstance(commit, dict):
            return None
        for key in ("added", "modified", "removed"):
            files = commit.get(key)
            if isinstance(files, list):
                changed.extend(str(f) for f in files)
    return changed


def _who(prefix: str, name: Any) -> str:
    return prefix + "".join(c for c in str(name or "push")[:150] if c.isprintable())


def _commit(value: Any, field: str) -> str:
    if not isinstance(value, str) or not (COMMIT.match(value) or value == ZERO):
        raise Problem(422, f"{field}: not a commit id (40 hex digits)")
    return value


async def _signed(
    ctx: ApiContext, urls: list[str], body: bytes, signature: str | None, header: str
) -> dict[StackRef, GitSource]:
    """The stacks bound to the repository whose secret verifies ``body``; a 401 when none."""

    def sources() -> list[tuple[StackRef, GitSource]]:
        return [pair for url in urls for pair in ctx.backend.sources_of_repository(url)]

    bound: dict[StackRef, GitSource] = {}
    for stack, source in await ctx.state(sources):
        bound.setdefault(stack, source)
    signed = {s: src for s, src in bound.items() if signature_ok(src.secret, body, signature)}
    if not signed:
        raise Problem(
            401,
            f"{header} does not match the secret of any stack bound to this repository (or "
            "none is bound): nothing started",
            "bad-signature",
        )
    return signed


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
    signed = await _signed(ctx, urls, body, signature, "X-Hub-Signature-256")
    result = HookResult(delivery=(delivery or "")[:100] or None)
    if event == "ping":
        return 200, result
    if event != "push":
        for stack in signed:
            result.ignored.append(
                HookSkip(**_names(stack), reason=f"event {str(event)[:40]!r} starts nothing")
            )
        return 202, result
    ref = data.get("ref")
    pusher = data.get("pusher")
    push = Push(
        urls=urls,
        ref=ref if isinstance(ref, str) else None,
        commit=_commit(data.get("after"), "after"),
        changed=_github_changed(data),
        deleted=bool(data.get("deleted")),
        who=_who("github:", pusher.get("name") if isinstance(pusher, dict) else None),
    )
    return await start_pushed(ctx, signed, push, result)


async def cloudevent_push(
    ctx: ApiContext, body: bytes, *, signature: str | None
) -> tuple[int, HookResult]:
    """A CloudEvents 1.0 JSON event (structured mode) telling of a push: ``data`` is
    ``{repository, ref, commit, changed?, pusher?}``, signed like GitHub's (HMAC-SHA256 of
    the body, ``X-Stackflow-Signature: sha256=<hex>``)."""
    event = _payload(body)
    if event.get("specversion") != "1.0":
        raise Problem(422, 'specversion: a CloudEvents 1.0 event is expected ("1.0")')
    for name in ("id", "source", "type"):
        if not isinstance(event.get(name), str) or not event[name]:
            raise Problem(422, f"{name}: required by CloudEvents 1.0 (a non-empty string)")
    data = event.get("data")
    if not isinstance(data, dict):
        raise Problem(422, "data: a JSON object {repository, ref, commit} is expected")
    url = data.get("repository")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise Problem(422, "data.repository: the repository's http(s) URL is expected")
    signed = await _signed(ctx, [url], body, signature, "X-Stackflow-Signature")
    result = HookResult(delivery=str(event["id"])[:100])
    changed = data.get("changed")
    ref = data.get("ref")
    push = Push(
        urls=[url],
        ref=ref if isinstance(ref, str) else None,
        commit=_commit(data.get("commit"), "data.commit"),
        changed=[str(c) for c in changed] if isinstance(changed, list) else None,
        who=_who("hook:", data.get("pusher") or event["source"]),
    )
    return await start_pushed(ctx, signed, push, result)


async def start_pushed(
    ctx: ApiContext, signed: dict[StackRef, GitSource], push: Push, result: HookResult
) -> tuple[int, HookResult]:
    """Each signed stack's run of the pushed commit (or why not); (HTTP status, result)."""
    commit = push.commit
    result.commit = commit
    stale: list[str] = []
    for stack, source in sorted(signed.items(), key=lambda item: str(item[0])):
        reason = _skip(push, source, set_start.set_name(stack) is not None)
        if reason is not None:
            result.ignored.append(HookSkip(**_names(stack), reason=reason))
            continue
        refused = await hook_replay.replay_refusal(ctx, stack, source, commit)
        if refused is not None:  # an old delivery (replayed or late): nothing starts
            stale.append(f"stack {stack}: {refused}")
            result.ignored.append(HookSkip(**_names(stack), reason=refused))
            continue
        # The run's requester is who bound the stack (an approver: binding needs the role,
        # and so does auto_approve), not the pusher the delivery names: four-eyes holds.
        by = (source.bound_by if isinstance(source, BoundSource) else None) or push.who
        name = set_start.set_name(stack)
        if name is not None and isinstance(source, BoundSource):
            try:
                made, new = await set_start.start_pushed_set(ctx, name, source, commit, by)
            except StackLockedError as err:
                result.ignored.append(HookSkip(**_names(stack), reason=str(err)))
                continue
            if new:
                await hook_replay.record_push(ctx, stack, source, commit)
            result.runs.append(
                HookRun(
                    **_names(stack),
                    run_id=made.run_id,
                    workflow_id=made.workflow_id,
                    operation=RunOperation(source.on_push.value),
                    created=new,
                    status_url=made.status_url,
                    events_url=made.status_url + "/events",
                )
            )
            continue
        request = RunRequest(
            operation=RunOperation(source.on_push.value),
            commit=commit,
            message=f"git push of {commit[:12]} to {source.branch_ref}",
        )
        if source.on_push == SourceMode.apply and source.auto_approve:
            request.auto_approve = True
        try:
            started = await run_start.start_run(
                ctx, stack, request, by, f"git:{commit}", role=Role.approver
            )
        except StackLockedError as err:
            result.ignored.append(HookSkip(**_names(stack), reason=str(err)))
            continue
        if started.created:
            await hook_replay.record_push(ctx, stack, source, commit)
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
    if stale and not result.runs:
        raise Problem(409, "; ".join(stale)[:2000], "stale-delivery")
    if any(r.created for r in result.runs):
        return 201, result
    return (200 if result.runs else 202), result


def _names(stack: StackRef) -> dict[str, str]:
    return {"project": stack.project, "workspace": stack.workspace}


def _skip(push: Push, source: GitSource, set_file: bool) -> str | None:
    """Why the push starts nothing (a set's member files may change without its file)."""
    if push.ref != source.branch_ref:
        return f"a push to {str(push.ref)[:200]}, not {source.branch_ref}"
    if push.deleted or push.commit == ZERO:
        return f"{source.branch_ref} was deleted"
    if push.changed is not None and source.path not in push.changed and not set_file:
        return f"the pushed commits do not change {source.path}"
    return None
