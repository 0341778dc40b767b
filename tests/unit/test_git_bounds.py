"""Bounded git fetches (:mod:`stackflow.state.git_pack`, :func:`stackflow.model.source._fetch`
through
``read_spec_file``/``read_directory``) against a real smart-HTTP server (dulwich's, as
tests/gitserver.py serves it): a fetch takes the bound branch only, never every ref; a pack
over ``STACKFLOW_GIT_MAX_PACK_BYTES`` stops with one line; an object that inflates past the
object limit (a zlib bomb) is refused before dulwich inflates it; a spec file over its limit
is refused from its pack header, not read; a host that does not answer stops the fetch at
``STACKFLOW_GIT_FETCH_TIMEOUT``."""

from __future__ import annotations

import secrets
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.repo import Repo

from stackflow.core.errors import SpecError
from stackflow.model.source import SourceRef
from stackflow.state import git_pack
from stackflow.state.git_sources import SPEC_FILE_LIMIT, SourceUnavailable, read_spec_file
from tests.gitserver import GitServer

SPEC = "resources: []\n"


def noise(n: int) -> str:
    """``n`` characters that do not compress much (base64 of random bytes)."""
    return secrets.token_urlsafe(n)[:n]


def test_a_fetch_takes_the_bound_branch_only(tmp_path: Path) -> None:
    with GitServer(tmp_path / "repo") as git:
        head = git.commit({"deploy/spec.yaml": SPEC})
        git.commit({"big.bin": noise(2 * 2**20)}, "a big file elsewhere", branch="assets")
        big = git.repo.refs[b"refs/heads/assets"]
        cache = tmp_path / "cache"
        at = SourceRef(url=git.url, commit=head, path="deploy/spec.yaml")
        assert read_spec_file(at, cache, "main") == SPEC
        [cached] = list(cache.iterdir())
        with Repo(str(cached)) as repo:
            assert head.encode() in repo.object_store
            assert big not in repo.object_store  # the other branch was never fetched


def test_a_pack_over_the_limit_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKFLOW_GIT_MAX_PACK_BYTES", str(2**20))
    with GitServer(tmp_path / "repo") as git:
        head = git.commit({"deploy/spec.yaml": SPEC, "big.txt": noise(2 * 2**20)})
        at = SourceRef(url=git.url, commit=head, path="deploy/spec.yaml")
        with pytest.raises(SpecError) as err:
            read_spec_file(at, tmp_path / "cache", "main")
        assert str(err.value) == (
            f"git source {git.url}: the pack is over 1 MiB (STACKFLOW_GIT_MAX_PACK_BYTES); "
            "fetch stopped"
        )
        # nothing half-fetched is kept: the next fetch, within a larger limit, reads it
        monkeypatch.setenv("STACKFLOW_GIT_MAX_PACK_BYTES", str(8 * 2**20))
        assert read_spec_file(at, tmp_path / "cache", "main") == SPEC


def test_an_object_that_inflates_past_the_limit_is_refused_before_it_is_inflated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(git_pack, "OBJECT_LIMIT", 4 * 2**20)
    with GitServer(tmp_path / "repo") as git:
        head = git.commit({"deploy/spec.yaml": SPEC, "zeros.txt": "0" * (64 * 2**20)})
        at = SourceRef(url=git.url, commit=head, path="deploy/spec.yaml")
        with pytest.raises(SpecError) as err:
            read_spec_file(at, tmp_path / "cache", "main")
    assert str(err.value) == (
        f"git source {git.url}: an object of 64 MiB is over 4 MiB, the largest file a fetch "
        "takes in; fetch stopped"
    )
    # refused before dulwich indexed (inflated) it: no pack was added to the cache
    assert not list((tmp_path / "cache").glob("*.git/objects/pack/*.pack"))


def test_a_spec_file_over_its_limit_is_refused_from_its_header(tmp_path: Path) -> None:
    with GitServer(tmp_path / "repo") as git:
        head = git.commit({"small.yaml": SPEC, "deploy/spec.yaml": "#" * (SPEC_FILE_LIMIT + 1)})
        cache = tmp_path / "cache"
        at = SourceRef(url=git.url, commit=head, path="small.yaml")
        assert read_spec_file(at, cache, "main") == SPEC  # fetched: the commit is cached
        big = at.model_copy(update={"path": "deploy/spec.yaml"})
        tracemalloc.start()
        try:
            with pytest.raises(SpecError, match=r"deploy/spec\.yaml is over 8 MiB"):
                read_spec_file(big, cache, "main")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 2**20, peak  # the header told: the 8 MiB blob was never inflated


@pytest.fixture
def silent_host() -> Iterator[str]:
    """An HTTP host that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/repo.git"
    done.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_host_that_does_not_answer_stops_the_fetch_at_its_time_limit(
    silent_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKFLOW_GIT_FETCH_TIMEOUT", "1")
    at = SourceRef(url=silent_host, commit="a" * 40, path="spec.yaml")
    began = time.monotonic()
    with pytest.raises(SourceUnavailable) as err:
        read_spec_file(at, tmp_path / "cache", "main")
    assert time.monotonic() - began < 10
    assert str(err.value).startswith(f"git source {silent_host}: ")
    assert "\n" not in str(err.value)


def test_bad_limits_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFLOW_GIT_MAX_PACK_BYTES", "-5")
    with pytest.raises(SpecError, match="STACKFLOW_GIT_MAX_PACK_BYTES='-5': a positive number"):
        git_pack.FetchLimits.from_env()
