"""Redis read-through cache of prior state (the state of the latest succeeded release).

Keys carry the revision: ``stackflow:prior:<project>/<workspace>:<revision>`` is a hash of
resource id → resource JSON, plus a completeness marker (a token of the fill that wrote
it). The revision always comes from storage (a cheap metadata read), so a cached entry can
never stand for a newer release. Redis is never the source of truth: when it is down or
flushed, reads go to storage with a single warning per cache object. Sensitive values are
stored sealed, as in the backend.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from stackflow.core.refs import StackRef
from stackflow.model.spec import Resource
from stackflow.state.backend import StateBackend

log = logging.getLogger(__name__)

_COMPLETE = "\x00complete"  # a field no resource id can be (ids are non-empty text)
_TTL_SECONDS = 7 * 24 * 3600
_RETRY_AFTER_SECONDS = 5.0
_SCAN_PAGE = 500
"""Fields asked of Redis per ``HSCAN`` when the whole state is read."""


class PriorStateCache:
    def __init__(
        self,
        redis_url: str | None,
        releases: StateBackend,
        *,
        socket_timeout: float = 0.5,
        key_prefix: str = "stackflow:prior",
    ) -> None:
        self.releases = releases
        self.key_prefix = key_prefix
        self._client: redis.Redis | None = (
            redis.Redis.from_url(
                redis_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                decode_responses=True,
            )
            if redis_url
            else None
        )
        self._warned = False
        self._down_until = 0.0

    # ---- public ---------------------------------------------------------------------------

    def prior(self, stack: StackRef) -> dict[str, Resource]:
        """State of the latest succeeded release, by resource id ({} if none)."""
        return dict(self._opened(stack))

    def each_prior(self, stack: StackRef) -> Iterator[Resource]:
        """The resources of :meth:`prior`, each opened as it is taken: for a reader that
        looks at every resource and keeps little of them, without the whole state opened at
        once (10,000 ConfigMaps: 73 MB, where their stored bodies take 26), nor read whole
        from Redis. One may come more than once (see :meth:`_stored`)."""
        for _, resource in self._opened(stack):
            yield resource

    def prior_resource(self, stack: StackRef, resource_id: str) -> Resource | None:
        """One resource of the prior state, or None if it is not in it."""
        return self.prior_of(stack, [resource_id]).get(resource_id)

    def prior_of(self, stack: StackRef, resource_ids: Iterable[str]) -> dict[str, Resource]:
        """The resources of the prior state among ``resource_ids``, by id: what a batch of
        a run needs, without reading (and opening) the whole state for each batch."""
        wanted = list(dict.fromkeys(resource_ids))
        revision = self.releases.latest_succeeded_revision(stack)
        if revision is None or not wanted:
            return {}
        key = self._key(stack, revision)
        found = self._call(lambda c: c.hmget(key, [*wanted, _COMPLETE]))
        if found is not None and found[-1] is not None:
            bodies = dict(zip(wanted, found[:-1], strict=True))
        else:
            bodies = self._fill(stack, revision)
        opened = self.releases.sealer.open
        return {rid: opened(stack, bodies[rid]) for rid in wanted if bodies.get(rid) is not None}

    def remember(self, stack: StackRef, revision: int) -> None:
        """Release ``revision`` succeeded: cache its state and drop older revisions of the
        stack."""
        self._fill(stack, revision)
        pattern = self._key(stack, "*")
        current = self._key(stack, revision)

        def drop_older(client: redis.Redis) -> None:
            for key in client.scan_iter(match=pattern, count=100):
                if key != current:
                    client.delete(key)

        self._call(drop_older)

    # ---- internals ------------------------------------------------------------------------

    def _opened(self, stack: StackRef) -> Iterator[tuple[str, Resource]]:
        revision = self.releases.latest_succeeded_revision(stack)
        if revision is None:
            return
        opened = self.releases.sealer.open
        for rid, raw in self._stored(stack, revision):
            yield rid, opened(stack, raw)

    def _stored(self, stack: StackRef, revision: int) -> Iterator[tuple[str, str]]:
        """The release's state as stored (id, sealed body), a page at a time from Redis when
        it holds the whole state (``HGETALL`` held it all at once: 156 MB for 50,000 files),
        from storage otherwise. When Redis fails midway, or the key goes (a newer release
        dropped it), storage gives it all again: a resource may come twice (as ``HSCAN``
        itself may give one), never be missed."""
        key = self._key(stack, revision)
        filled = self._call(lambda c: c.hget(key, _COMPLETE))
        if filled is not None:
            cursor = 0
            while True:
                page = self._call(lambda c, at=cursor: c.hscan(key, at, count=_SCAN_PAGE))
                if page is None:
                    break
                cursor, found = page
                yield from ((rid, raw) for rid, raw in found.items() if rid != _COMPLETE)
                if cursor == 0:
                    # the same fill from first page to last (not dropped, nor written again)
                    if self._call(lambda c: c.hget(key, _COMPLETE)) == filled:
                        return
                    break
        yield from self._fill(stack, revision).items()

    def _key(self, stack: StackRef, revision: int | str) -> str:
        """The key of ``stack``'s state at ``revision`` (``"*"``: at any)."""
        return f"{self.key_prefix}:{stack}:{revision}"

    def _fill(self, stack: StackRef, revision: int) -> dict[str, str]:
        """The release's state as stored (sealed), copied into Redis as it is: nothing is
        opened or sealed again; readers open what they take."""
        stored = self.releases.sealed_resources(stack, revision)
        self._store(stack, revision, stored)
        return stored

    def _store(self, stack: StackRef, revision: int, stored: dict[str, str]) -> None:
        key = self._key(stack, revision)
        mapping: dict[Any, Any] = {**stored, _COMPLETE: uuid.uuid4().hex}  # this fill's own

        def write(client: redis.Redis) -> None:
            pipe = client.pipeline(transaction=True)
            pipe.delete(key)
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, _TTL_SECONDS)
            pipe.execute()

        self._call(write)

    def _call(self, fn: Any) -> Any:
        """Run ``fn(client)``; None when disabled or Redis fails (warned once)."""
        if self._client is None or time.monotonic() < self._down_until:
            return None
        try:
            return fn(self._client)
        except (redis.RedisError, OSError) as err:
            self._down_until = time.monotonic() + _RETRY_AFTER_SECONDS
            if not self._warned:
                self._warned = True
                log.warning("redis unavailable, reading prior state from storage: %s", err)
            return None
