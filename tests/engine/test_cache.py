"""The Redis prior-state cache against a real redis-server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.release import Operation, Phase, Release
from stackflow.model.spec import Resource, ResourceType
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache

P, W = "proj", "dev"
STACK = StackRef(P, W)


def res(rid: str, **attrs: object) -> Resource:
    return Resource(id=rid, type=ResourceType.OnPrem, attributes=dict(attrs))


def succeed(store: StateBackend, *resources: Resource, phase: Phase = Phase.succeeded) -> Release:
    """One whole release by a run of its own; returned with its state, as remember() needs."""
    run = RunRef("apply", f"run-{len(store.revisions(STACK)) + 1}")
    release = store.create(STACK, Operation.apply, None, run=run)
    for r in resources:
        store.record_resource(STACK, release.revision, r, run=run)
    store.set_phase(STACK, release.revision, phase, run=run)
    return store.get(STACK, release.revision, with_spec=False)


@pytest.fixture
def releases(backend: StateBackend) -> StateBackend:
    return backend


def test_read_through_fill(
    redis_server: Any, releases: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    succeed(releases, res("a", v=1), res("b", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior(STACK) == {"a": res("a", v=1), "b": res("b", v=1)}
    key = f"stackflow:prior:{P}/{W}:1"
    assert redis_server.client.exists(key)
    # now served from redis: storage's full read is not used any more
    monkeypatch.setattr(releases, "get", lambda *a, **k: pytest.fail("storage read on a cache hit"))
    monkeypatch.setattr(
        releases, "resources", lambda *a, **k: pytest.fail("storage read on a cache hit")
    )
    assert cache.prior(STACK)["b"] == res("b", v=1)
    assert cache.prior_resource(STACK, "a") == res("a", v=1)
    assert cache.prior_resource(STACK, "zzz") is None  # known absent: the hash is complete


@pytest.mark.parametrize("with_redis", [True, False])
def test_each_prior_opens_one_resource_at_a_time(
    redis_server: Any, releases: StateBackend, monkeypatch: pytest.MonkeyPatch, with_redis: bool
) -> None:
    succeed(releases, res("a", v=1), res("b", v=2), res("c", v=3))
    cache = PriorStateCache(redis_server.url if with_redis else None, releases)
    real_open = releases.sealer.open
    opened: list[str] = []

    def counting_open(stack: StackRef, body: str) -> Resource:
        resource = real_open(stack, body)
        opened.append(resource.id)
        return resource

    monkeypatch.setattr(releases.sealer, "open", counting_open)
    each = cache.each_prior(STACK)
    first = next(each)
    assert opened == [first.id]  # the others are still their stored bodies
    rest = list(each)
    assert sorted([first, *rest], key=lambda r: r.id) == [
        res("a", v=1),
        res("b", v=2),
        res("c", v=3),
    ]
    assert cache.prior(STACK) == {r.id: r for r in [first, *rest]}  # the same, by id
    assert list(PriorStateCache(None, releases).each_prior(StackRef(P, "none"))) == []


def test_each_prior_reads_redis_a_page_at_a_time(
    redis_server: Any, releases: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole state from Redis in pages (never one ``HGETALL``), storage untouched."""
    import stackflow.state.cache as cache_module

    state = [res(f"r{i}", v=i) for i in range(7)]
    succeed(releases, *state)
    cache = PriorStateCache(redis_server.url, releases)
    cache.prior_of(STACK, ["r0"])  # fills Redis
    monkeypatch.setattr(cache_module, "_SCAN_PAGE", 2)
    assert cache._client is not None
    monkeypatch.setattr(cache._client, "hgetall", lambda *a: pytest.fail("read whole"))
    monkeypatch.setattr(releases, "sealed_resources", lambda *a: pytest.fail("storage read"))
    scans: list[int] = []
    real_hscan = cache._client.hscan

    def counting_hscan(*args: Any, **kwargs: Any) -> Any:
        scans.append(1)
        return real_hscan(*args, **kwargs)

    monkeypatch.setattr(cache._client, "hscan", counting_hscan)
    assert {r.id: r for r in cache.each_prior(STACK)} == {r.id: r for r in state}
    assert len(scans) >= 2


@pytest.mark.parametrize("midway", ["dropped", "written again"])
def test_each_prior_misses_nothing_when_the_key_changes_midway(
    redis_server: Any, releases: StateBackend, monkeypatch: pytest.MonkeyPatch, midway: str
) -> None:
    """A key dropped (a newer release) or filled again while its pages are read: storage
    gives the state again, and every resource comes (one may come twice)."""
    import stackflow.state.cache as cache_module

    state = [res(f"r{i}", v=i) for i in range(9)]
    succeed(releases, *state)
    cache = PriorStateCache(redis_server.url, releases)
    cache.prior_of(STACK, ["r0"])
    monkeypatch.setattr(cache_module, "_SCAN_PAGE", 2)
    each = cache.each_prior(STACK)
    seen = [next(each)]
    key = f"stackflow:prior:{P}/{W}:1"
    if midway == "dropped":
        redis_server.client.delete(key)
    else:
        cache.remember(STACK, 1)
    seen += list(each)
    assert {r.id: r for r in seen} == {r.id: r for r in state}


def test_prior_resource_fills_on_miss(redis_server: Any, releases: StateBackend) -> None:
    succeed(releases, res("a", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior_resource(STACK, "a") == res("a", v=1)
    assert redis_server.client.hexists(f"stackflow:prior:{P}/{W}:1", "a")
    assert cache.prior_resource(STACK, "b") is None


def test_prior_of_reads_only_the_ids_asked(
    redis_server: Any, releases: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preview batch asks for its own resources and what they reference: one HMGET of
    those, each opened, never the whole state; a miss (or a flushed Redis) fills from storage."""
    succeed(releases, *(res(f"r{i}", v=i) for i in range(50)))
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior_of(STACK, ["r3", "r7", "nope", "r3"]) == {
        "r3": res("r3", v=3),
        "r7": res("r7", v=7),
    }
    opened: list[str] = []
    real_open = releases.sealer.open

    def counted(stack: StackRef, raw: str) -> Resource:
        found = real_open(stack, raw)
        opened.append(found.id)
        return found

    monkeypatch.setattr(releases.sealer, "open", counted)
    monkeypatch.setattr(releases, "get", lambda *a, **k: pytest.fail("storage read on a cache hit"))
    assert cache.prior_of(STACK, ["r10", "r11"]) == {
        "r10": res("r10", v=10),
        "r11": res("r11", v=11),
    }
    assert sorted(opened) == ["r10", "r11"]
    assert cache.prior_of(STACK, []) == {}
    monkeypatch.undo()
    redis_server.client.flushall()
    assert cache.prior_of(STACK, ["r49", "x"]) == {"r49": res("r49", v=49)}


def test_no_succeeded_release(redis_server: Any, releases: StateBackend) -> None:
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior(STACK) == {} and cache.prior_resource(STACK, "a") is None
    succeed(releases, res("a"), phase=Phase.failed)
    assert cache.prior(STACK) == {}


def test_replaced_on_new_succeeded_release(redis_server: Any, releases: StateBackend) -> None:
    succeed(releases, res("a", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior(STACK)["a"].attributes == {"v": 1}
    second = succeed(releases, res("a", v=2), res("b"))
    cache.remember(STACK, second.revision)
    assert not redis_server.client.exists(f"stackflow:prior:{P}/{W}:1")
    assert redis_server.client.exists(f"stackflow:prior:{P}/{W}:2")
    assert cache.prior(STACK)["a"].attributes == {"v": 2}
    assert cache.prior_resource(STACK, "b") == res("b")


def test_never_a_stale_revision(redis_server: Any, releases: StateBackend) -> None:
    succeed(releases, res("a", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    other_worker = PriorStateCache(redis_server.url, releases)
    assert cache.prior_resource(STACK, "a") == res("a", v=1)
    succeed(releases, res("a", v=2))  # succeeded elsewhere; nobody called remember()
    assert other_worker.prior_resource(STACK, "a") == res("a", v=2)
    assert cache.prior(STACK)["a"] == res("a", v=2)
    # a later failed release does not change what "prior" is
    succeed(releases, res("a", v=3), phase=Phase.failed)
    assert cache.prior_resource(STACK, "a") == res("a", v=2)


def test_flushall_is_harmless(redis_server: Any, releases: StateBackend) -> None:
    succeed(releases, res("a", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    cache.prior(STACK)
    redis_server.client.flushall()
    assert cache.prior_resource(STACK, "a") == res("a", v=1)
    redis_server.client.flushall()
    assert cache.prior(STACK) == {"a": res("a", v=1)}


def test_server_killed_mid_test(
    redis_server: Any, releases: StateBackend, caplog: pytest.LogCaptureFixture
) -> None:
    succeed(releases, res("a", v=1))
    cache = PriorStateCache(redis_server.url, releases)
    assert cache.prior(STACK)["a"] == res("a", v=1)
    redis_server.stop()
    caplog.set_level(logging.WARNING, logger="stackflow.state.cache")
    second = succeed(releases, res("a", v=2))
    for _ in range(3):
        assert cache.prior(STACK)["a"] == res("a", v=2)
        assert cache.prior_resource(STACK, "a") == res("a", v=2)
    cache.remember(STACK, second.revision)
    warnings = [r for r in caplog.records if r.name == "stackflow.state.cache"]
    assert len(warnings) == 1 and "redis unavailable" in warnings[0].getMessage()


def test_unreachable_and_disabled(releases: StateBackend, caplog: pytest.LogCaptureFixture) -> None:
    succeed(releases, res("a"))
    caplog.set_level(logging.WARNING, logger="stackflow.state.cache")
    nowhere = PriorStateCache("redis://127.0.0.1:1/0", releases)
    assert nowhere.prior(STACK) == {"a": res("a")}
    assert nowhere.prior_resource(STACK, "a") == res("a")
    assert len([r for r in caplog.records if r.name == "stackflow.state.cache"]) == 1
    disabled = PriorStateCache(None, releases)
    assert disabled.prior_resource(STACK, "a") == res("a")
    assert len([r for r in caplog.records if r.name == "stackflow.state.cache"]) == 1
