"""Git sources as data: a stack bound to a spec file in a git repository
(:class:`GitSource`, kept in the state backend: the repository, the branch a push to which
starts a run, the spec file's path, whether that run is an apply or a preview and whether it
is approved up front, the webhook secret), and a run of an exact commit (:class:`SourceRef`:
url, commit, path). Fetching a commit and reading the file is
:mod:`stackflow.state.git_sources`'s."""

from __future__ import annotations

import posixpath
import re
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

COMMIT = re.compile(r"^[0-9a-f]{40}$")


class SourceMode(StrEnum):
    apply = "apply"
    preview = "preview"


def check_url(url: str) -> str:
    if not url.isprintable() or " " in url:
        raise ValueError("a URL of printable characters and no spaces")
    if url.startswith("/"):
        url = "file://" + url  # a local path: kept as its file:// URL
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError("a local repository is file:///<absolute path> (or the path)")
        if ".." in parts.path.split("/") or parts.query or parts.fragment:
            raise ValueError("a local repository's path has no '..', query or fragment")
        return f"file://{posixpath.normpath(parts.path)}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "a git source is an http(s) URL of a repository (smart HTTP), or file:///<path> "
            "of one on the worker"
        )
    if parts.username or parts.password:
        raise ValueError(
            "no credentials in the URL: the worker's STACKFLOW_GIT_CREDENTIALS has them"
        )
    return url


def _check_path(path: str) -> str:
    if not path.isprintable():
        raise ValueError("a path of printable characters")
    clean = posixpath.normpath(path)
    if path.startswith("/") or clean.startswith("..") or clean in (".", "") or "\\" in path:
        raise ValueError("a relative path of a file inside the repository, e.g. deploy/spec.yaml")
    return clean


class GitSource(BaseModel):
    """A stack's binding to a spec file in a git repository."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2000)
    ref: str = Field(default="main", min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._/-]+$")
    """The branch whose pushes start runs (``main`` or ``refs/heads/main``)."""
    path: str = Field(min_length=1, max_length=1000)
    on_push: SourceMode = Field(
        default=SourceMode.apply,
        validation_alias=AliasChoices("on_push", "mode"),
        description="What a push to `ref` starts: an apply or a preview of the pushed commit. "
        "`mode`, its former name, is accepted too.",
    )
    auto_approve: bool = False
    """A push's apply is approved up front (else it waits for an approver)."""
    secret: str = Field(min_length=16, max_length=256, repr=False)
    """What the webhook's HMAC-SHA256 signature is made with (stored sealed)."""

    _url = field_validator("url")(classmethod(lambda cls, v: check_url(v)))
    _path = field_validator("path")(classmethod(lambda cls, v: _check_path(v)))

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "on_push" in data and "mode" in data:
            raise ValueError("on_push and mode (its former name) both given: give on_push")
        return data

    @property
    def branch_ref(self) -> str:
        return self.ref if self.ref.startswith("refs/") else f"refs/heads/{self.ref}"

    def public(self) -> dict[str, Any]:
        """The binding without its secret (what reads show)."""
        return self.model_dump(mode="json", exclude={"secret"})


class BoundSource(GitSource):
    """A stack's binding as the state backend keeps it: the source and who bound it."""

    bound_by: str | None = Field(default=None, max_length=200)
    """Who bound the stack (the approver whose ``PUT …/source`` it was): the requester the
    runs its pushes record, so four-eyes holds for them (None: a binding made without a
    name, whose runs record the pusher the delivery names)."""


class SourceRef(BaseModel):
    """What a run of a source names, and its release records: the repository, the exact
    commit, the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=2000)
    commit: str = Field(pattern=COMMIT.pattern)
    path: str = Field(min_length=1, max_length=1000)

    _url = field_validator("url")(classmethod(lambda cls, v: check_url(v)))
    _path = field_validator("path")(classmethod(lambda cls, v: _check_path(v)))


def same_repository(a: str, b: str) -> bool:
    """Whether two URLs name one repository (scheme, host and path; ``.git`` and a trailing
    slash aside, host case-insensitive)."""

    def key(url: str) -> tuple[str, str]:
        if url.startswith("/"):
            url = "file://" + url
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        path = path[:-4] if path.endswith(".git") else path
        return ((parts.hostname or "").lower() + f":{parts.port or ''}", path)

    return key(a) == key(b)
