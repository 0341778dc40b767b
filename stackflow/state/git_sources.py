"""Reading a git source: the worker fetches a run's commit with dulwich into a cache under its
home (a cache: any worker can fetch again) and reads the file from the commit's tree, never
from a working tree, so a path can name nothing outside the repository. Credentials for
private repositories come from the worker's configuration (``STACKFLOW_GIT_CREDENTIALS``),
never from the spec or the binding.

A repository on the worker's own disk (``file:///srv/git/infra.git``, or an absolute path,
kept as its ``file://`` URL) is read only inside the directories the worker's
``STACKFLOW_GIT_LOCAL_ROOTS`` names (none by default: refused with one line saying so), so
binding a source never makes a worker read a repository its operator did not offer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from stackflow.core.errors import BackendUnavailableError, SpecError
from stackflow.model.source import SourceRef, check_url
from stackflow.state.git_pack import (
    FETCH_TIMEOUT_ENV,
    FetchLimits,
    FetchRefused,
    PackSink,
    check_pack,
    stored_size,
)

SPEC_FILE_LIMIT = 8 * 1024 * 1024
"""Largest spec file read from a commit."""


CREDENTIALS_ENV = "STACKFLOW_GIT_CREDENTIALS"


LOCAL_ROOTS_ENV = "STACKFLOW_GIT_LOCAL_ROOTS"


FETCH_CONNECT, FETCH_READ = 10.0, 120.0
"""Seconds a fetch waits to connect, and for each read: a git host that hangs never holds a
run (the activity is retried within its bounds)."""


class SourceUnavailable(BackendUnavailableError):
    """The repository could not be reached: retried like an unreachable state backend,
    within the run's ``unavailable_timeout``."""


def _credentials(url: str) -> tuple[str | None, str | None]:
    """``(username, password)`` for ``url`` from the file ``STACKFLOW_GIT_CREDENTIALS`` names:
    ``{"<url prefix>": {"username": ..., "password": ...}}``, the longest prefix wins."""
    path = os.environ.get(CREDENTIALS_ENV)
    if not path:
        return None, None
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"{CREDENTIALS_ENV} {path}: cannot be read: {err}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{CREDENTIALS_ENV} {path}: a map of URL prefixes is expected")
    found = [(prefix, v) for prefix, v in data.items() if url.startswith(str(prefix))]
    if not found:
        return None, None
    _, entry = max(found, key=lambda item: len(str(item[0])))
    if not isinstance(entry, dict):
        raise SpecError(f"{CREDENTIALS_ENV} {path}: each entry is {{username, password}}")
    return entry.get("username"), entry.get("password")


def local_repository(url: str) -> str | None:
    """The path of a ``file://`` source on this worker, once it is inside one of the
    directories ``STACKFLOW_GIT_LOCAL_ROOTS`` names (symlinks resolved); None for a remote
    one. SpecError (exit 2, never retried) when this worker does not offer it."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    roots = [r for r in os.environ.get(LOCAL_ROOTS_ENV, "").split(os.pathsep) if r.strip()]
    real = os.path.realpath(parts.path)
    for root in roots:
        base = os.path.realpath(os.path.expanduser(root.strip()))
        if os.path.isabs(root.strip()) and (real == base or real.startswith(base + os.sep)):
            return real
    offered = ", ".join(roots) if roots else "none"
    raise SpecError(
        f"git source {url}: this worker reads local repositories only inside "
        f"{LOCAL_ROOTS_ENV} (set: {offered}); use an http(s) URL, or have the worker's "
        "operator add the directory"
    )


_locks: dict[str, threading.Lock] = {}


_locks_guard = threading.Lock()


def _cache_lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _refs(found: Any) -> dict[bytes, bytes]:
    return {bytes(name): bytes(sha) for name, sha in dict(found).items() if sha is not None}


def branch_ref(ref: str) -> bytes:
    """``main`` or ``refs/heads/main`` as the ref name a remote advertises."""
    return (ref if ref.startswith("refs/") else f"refs/heads/{ref}").encode()


def _fetch(
    url: str,
    repo: Any,
    branch: bytes,
    commit: str | None = None,
    any_local: bool = False,
) -> bytes | None:
    """Fetch ``branch`` of ``url`` into ``repo`` (that ref only, never all of them: ``HEAD``
    when no branch is bound), then ``commit`` by its id when it is not on that branch (a
    host that serves commits by id: GitHub, GitLab, git's protocol v2); the branch's head
    (None when the remote has no such branch). Each pack is bounded
    (:mod:`stackflow.state.git_pack`: its
    bytes, the fetch's time, every object's inflated size). A local repository only inside
    the worker's roots, unless ``any_local`` (the CLI on its user's machine). SpecError when
    refused; SourceUnavailable when it cannot be reached or is too slow."""
    import urllib3
    from dulwich.client import HTTPUnauthorized, LocalGitClient, get_transport_and_path
    from dulwich.errors import GitProtocolError, HangupException, NotGitRepository

    limits = FetchLimits.from_env()
    started = time.monotonic()

    def too_slow() -> Exception:
        return SourceUnavailable(
            f"git source {url}: the fetch took over {limits.seconds:g} s "
            f"({FETCH_TIMEOUT_ENV}); stopped"
        )

    client: Any
    if any_local and urlsplit(url).scheme == "file":
        local: str | None = urlsplit(url).path
    else:
        local = local_repository(url)
    if local is not None:
        client, path = LocalGitClient(), local
    else:
        username, password = _credentials(url)
        read = min(FETCH_READ, limits.seconds)
        client, path = get_transport_and_path(
            url,
            username=username,
            password=password,
            pool_manager=urllib3.PoolManager(
                timeout=urllib3.Timeout(connect=FETCH_CONNECT, read=read), retries=False
            ),
        )

    def one_fetch(want: Callable[[dict[bytes, bytes]], list[bytes]]) -> dict[bytes, bytes]:
        store = repo.object_store
        left = limits.seconds - (time.monotonic() - started)
        if left <= 0:
            raise too_slow()
        bounded = FetchLimits(limits.pack_bytes, left, limits.object_bytes)
        fd, pack = tempfile.mkstemp(dir=store.path, prefix="incoming-")
        try:
            with os.fdopen(fd, "w+b") as f:
                sink = PackSink(f, url, bounded, too_slow)

                def wants(refs: Any, depth: int | None = None) -> list[bytes]:
                    return [sha for sha in want(_refs(refs)) if sha not in store]

                found = client.fetch_pack(
                    path,
                    wants,
                    repo.get_graph_walker(),
                    sink.write,
                    ref_prefix=[branch],
                )
                f.flush()
                if sink.size:
                    check_pack(pack, url, sink)
                    f.seek(0)
                    store.add_thin_pack(f.read, None)
            return _refs(found.refs)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pack)

    try:
        head = one_fetch(lambda refs: [refs[branch]] if branch in refs else []).get(branch)
        if commit is not None and commit.encode() not in repo.object_store:
            try:
                one_fetch(lambda refs: [commit.encode()])
            except (GitProtocolError, HangupException) as err:
                text = " ".join(str(err).split())[:200]
                at = f" (at {head.decode()[:12]})" if head else ""
                raise SpecError(
                    f"git source {url}: commit {commit} is not in the repository's "
                    f"{branch.decode()}{at}, and the host serves no other commit by id ({text})"
                ) from None
        return head
    except (FetchRefused, SourceUnavailable, SpecError):
        raise
    except HTTPUnauthorized:
        raise SpecError(
            f"git source {url}: the host refused the credentials "
            f"({CREDENTIALS_ENV} names them: on the worker, and on the API for webhooks)"
        ) from None
    except NotGitRepository as err:
        text = " ".join(str(err).split())[:300]
        if local is not None:
            raise SpecError(f"git source {url}: {text}") from None
        raise SourceUnavailable(f"git source {url}: {text}") from None
    except (
        GitProtocolError,
        HangupException,
        OSError,
        urllib3.exceptions.HTTPError,
    ) as err:
        text = " ".join(str(err).split())[:300]
        if local is not None:
            raise SpecError(f"git source {url}: {text}") from None
        raise SourceUnavailable(f"git source {url}: {text}") from None


@contextlib.contextmanager
def _cached_repo(url: str, cache: Path) -> Iterator[Any]:
    """The bare repository caching ``url`` under ``cache`` (locked while in use)."""
    from dulwich.repo import Repo

    key = hashlib.sha256(url.encode()).hexdigest()[:32]
    where = cache / f"{key}.git"
    with _cache_lock(key):
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        repo = Repo(str(where)) if where.exists() else Repo.init_bare(str(where), mkdir=True)
        try:
            yield repo
        finally:
            repo.close()


def _tree_of(repo: Any, url: str, commit_hex: str) -> Any:
    from dulwich.objects import Commit, Tree

    store: Any = repo.object_store
    commit_id = commit_hex.encode()
    if commit_id not in store:
        raise SpecError(f"git source {url}: commit {commit_hex} is not in the repository")
    commit = store[commit_id]
    if not isinstance(commit, Commit):
        raise SpecError(f"git source {url}: {commit_hex} is not a commit")
    tree = repo[commit.tree]
    assert isinstance(tree, Tree)
    return tree


def _check_size(repo: Any, sha: bytes, url: str, path: str) -> None:
    """SpecError when object ``sha`` (``path``) is over :data:`SPEC_FILE_LIMIT`, told by its
    pack entry's header before it is inflated."""
    size = stored_size(repo, sha)
    if size is not None and size > SPEC_FILE_LIMIT:
        raise SpecError(f"git source {url}: {path} is over {SPEC_FILE_LIMIT // (1024 * 1024)} MiB")


def _text(url: str, path: str, blob: Any) -> str:
    if blob.raw_length() > SPEC_FILE_LIMIT:
        raise SpecError(f"git source {url}: {path} is over {SPEC_FILE_LIMIT // (1024 * 1024)} MiB")
    try:
        return str(blob.as_raw_string().decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"git source {url}: {path} is not UTF-8 text") from None


def read_spec_file(source: SourceRef, cache: Path, ref: str | None = None) -> str:
    """The text of ``source.path`` at ``source.commit``, fetched into a bare repository
    cached under ``cache`` when the commit is not there yet: the branch ``ref`` (the
    stack's binding's; else the remote's ``HEAD``) only, then the commit by its id if it is
    not on it. SpecError for a
    missing commit or file (naming it) or a fetch over its bounds; SourceUnavailable when
    the repository cannot be reached."""
    from dulwich.objects import Blob, Tree

    with _cached_repo(source.url, cache) as repo:
        local_repository(source.url)  # a local source is read only inside the roots, cached or not
        if source.commit.encode() not in repo.object_store:
            branch = branch_ref(ref) if ref is not None else b"HEAD"
            _fetch(source.url, repo, branch, source.commit)
        tree = _tree_of(repo, source.url, source.commit)
        parts = source.path.split("/")
        for part in parts:
            try:
                _, sha = tree[part.encode()]
            except KeyError:
                raise SpecError(
                    f"git source {source.url}: {source.path} is not in commit {source.commit[:12]}"
                ) from None
            if part == parts[-1]:
                _check_size(repo, sha, source.url, source.path)
            found = repo[sha]
            if isinstance(found, Tree):
                tree = found
                continue
            if not isinstance(found, Blob) or part != parts[-1]:
                raise SpecError(f"git source {source.url}: {source.path} is not a file")
            return _text(source.url, source.path, found)
        raise SpecError(f"git source {source.url}: {source.path} is a directory")


def read_directory(
    url: str, ref: str, path: str, cache: Path, suffix: str, any_local: bool = False
) -> tuple[str, dict[str, str]]:
    """The branch ``ref``'s head commit of ``url`` and the text of every ``suffix`` file
    under ``path`` in it (by its path below ``path``): what ``stackflow policy push --git``
    stores as a bundle, pinned to that commit."""
    from dulwich.objects import Blob, Tree

    url = check_url(url)
    branch = branch_ref(ref)
    with _cached_repo(url, cache) as repo:
        head = _fetch(url, repo, branch, any_local=any_local)
        if head is None:
            raise SpecError(f"git source {url}: no branch {ref}")
        commit = head.decode()
        tree = _tree_of(repo, url, commit)
        clean = posixpath.normpath(path).strip("/")
        for part in [] if clean in ("", ".") else clean.split("/"):
            try:
                _, sha = tree[part.encode()]
            except KeyError:
                raise SpecError(
                    f"git source {url}: {path} is not in commit {commit[:12]}"
                ) from None
            tree = repo[sha]
            if not isinstance(tree, Tree):
                raise SpecError(f"git source {url}: {path} is not a directory")
        files: dict[str, str] = {}
        for entry in repo.object_store.iter_tree_contents(tree.id):
            name = entry.path.decode("utf-8", errors="replace")
            if not name.endswith(suffix):
                continue
            _check_size(repo, entry.sha, url, f"{clean}/{name}")
            blob = repo[entry.sha]
            if isinstance(blob, Blob):
                files[name] = _text(url, f"{clean}/{name}", blob)
        return commit, files


def push_refusal(url: str, ref: str, commit: str, last: str | None, cache: Path) -> str | None:
    """Why a delivery of ``commit`` for the branch ``ref`` of ``url`` must start nothing
    (None when it may): it must be the branch's head now, as the host says (the branch
    fetched, bounded like every fetch), or on the branch and newer than ``last``, the
    commit the last delivery ran (a quick second push may be delivered first). A captured
    delivery replayed later carries neither."""
    from dulwich.graph import can_fast_forward

    branch = branch_ref(ref)
    with _cached_repo(url, cache) as repo:
        head = _fetch(url, repo, branch)
        if head is None:
            return f"{branch.decode()} is not on {url} any more: nothing started"
        if head.decode() == commit:
            return None
        store = repo.object_store
        wanted: Any = commit.encode()
        known: Any = (last or "").encode()
        tip: Any = head
        if (
            last
            and last != commit
            and wanted in store
            and known in store
            and can_fast_forward(repo, known, wanted)
            and can_fast_forward(repo, wanted, tip)
        ):
            return None
        newer = f" nor newer than {last[:12]}, the last commit a delivery ran" if last else ""
        return (
            f"commit {commit[:12]} is not the head of {branch.decode()} (now "
            f"{head.decode()[:12]}){newer}: an old delivery, replayed or late; nothing started"
        )


def git_cache() -> Path:
    """Where a worker keeps the repositories it fetched (a cache)."""
    from stackflow.core.config import stackflow_home

    return stackflow_home() / "git"
