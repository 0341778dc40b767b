"""Git sources: bindings and commit references refuse what could reach outside a repository
or carry credentials; a spec file is read at an exact commit from a repository served over
smart HTTP (dulwich's server, real fetches); webhook signatures are HMAC-SHA256 of the body."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from pydantic import ValidationError

from stackflow.api.hooks import signature_ok
from stackflow.core.errors import SpecError
from stackflow.model.source import GitSource, SourceRef, same_repository
from stackflow.state.git_sources import (
    LOCAL_ROOTS_ENV,
    SourceUnavailable,
    read_directory,
    read_spec_file,
)
from tests.gitserver import GitServer

SECRET = "a-webhook-secret-of-some-length"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "file://host/etc"),
        ("url", "file:relative/repo"),
        ("url", "file:///srv/../etc"),
        ("url", "relative/repo"),
        ("url", "ssh://git@example.com/repo.git"),
        ("url", "https://user:token@example.com/repo.git"),
        ("url", "https://example.com/re po.git"),
        ("path", "/etc/passwd"),
        ("path", "../outside.yaml"),
        ("path", "deploy/../../x.yaml"),
        ("path", "."),
        ("path", "spec\x1b[2J.yaml"),
        ("secret", "short"),
        ("ref", "main; rm -rf"),
    ],
)
def test_a_binding_refuses(field: str, value: str) -> None:
    data = {"url": "https://example.com/acme/infra.git", "path": "spec.yaml", "secret": SECRET}
    data[field] = value
    with pytest.raises(ValidationError) as err:
        GitSource.model_validate(data)
    assert err.value.errors()[0]["loc"] == (field,)


def test_a_binding_shows_no_secret_and_names_its_branch() -> None:
    source = GitSource(url="https://example.com/a.git", path="./deploy/spec.yaml", secret=SECRET)
    assert source.path == "deploy/spec.yaml" and source.branch_ref == "refs/heads/main"
    assert "secret" not in source.public() and SECRET not in repr(source)
    assert GitSource(url=source.url, path="s", ref="refs/heads/x", secret=SECRET).branch_ref == (
        "refs/heads/x"
    )


def test_a_local_repository_is_its_file_url() -> None:
    data = {"path": "spec.yaml", "secret": SECRET}
    assert GitSource(url="/srv/git/infra.git", **data).url == "file:///srv/git/infra.git"
    assert GitSource(url="file:///srv/git//infra.git/", **data).url == "file:///srv/git/infra.git"
    assert same_repository("/srv/git/infra", "file:///srv/git/infra.git")


def test_a_local_repository_is_read_only_inside_the_workers_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "offered").mkdir()
    with GitServer(tmp_path / "offered" / "repo") as git:
        first = git.commit({"spec.yaml": "resources: []\n"})
    at = SourceRef(url=f"file://{tmp_path}/offered/repo", commit=first, path="spec.yaml")
    monkeypatch.delenv(LOCAL_ROOTS_ENV, raising=False)
    with pytest.raises(SpecError, match=f"only inside {LOCAL_ROOTS_ENV} \\(set: none\\)"):
        read_spec_file(at, tmp_path / "cache")
    monkeypatch.setenv(LOCAL_ROOTS_ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(SpecError, match="only inside"):
        read_spec_file(at, tmp_path / "cache")
    # a symlink inside a root to a repository outside it is still outside
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link").symlink_to(tmp_path / "offered" / "repo")
    linked = at.model_copy(update={"url": f"file://{tmp_path}/elsewhere/link"})
    with pytest.raises(SpecError, match="only inside"):
        read_spec_file(linked, tmp_path / "cache")
    monkeypatch.setenv(LOCAL_ROOTS_ENV, str(tmp_path / "offered"))
    assert read_spec_file(at, tmp_path / "cache") == "resources: []\n"
    missing = at.model_copy(update={"url": f"file://{tmp_path}/offered/none"})
    with pytest.raises(SpecError, match="offered/none"):
        read_spec_file(missing, tmp_path / "cache2")


def test_same_repository() -> None:
    assert same_repository("https://GitHub.com/acme/infra.git", "https://github.com/acme/infra/")
    assert not same_repository("https://github.com/acme/infra", "https://github.com/acme/other")
    assert not same_repository(
        "https://github.com:8443/acme/infra", "https://github.com/acme/infra"
    )


def test_signature_is_hmac_sha256_of_the_body() -> None:
    body = b'{"ref": "refs/heads/main"}'
    good = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert signature_ok(SECRET, body, good)
    assert signature_ok(SECRET, body, good.upper().replace("SHA256=", "sha256="))
    assert not signature_ok(SECRET, body + b" ", good)
    assert not signature_ok("another-secret-of-length", body, good)
    assert not signature_ok(SECRET, body, None)
    assert not signature_ok(SECRET, body, good.replace("sha256=", "sha1="))


def test_a_spec_is_read_at_an_exact_commit(tmp_path: Path) -> None:
    with GitServer(tmp_path / "repo") as git:
        first = git.commit({"deploy/spec.yaml": "resources: []\n", "README": "hi\n"})
        second = git.commit({"deploy/spec.yaml": "resources: [{id: a}]\n"})
        cache = tmp_path / "cache"
        at = SourceRef(url=git.url, commit=first, path="deploy/spec.yaml")
        assert read_spec_file(at, cache) == "resources: []\n"
        later = at.model_copy(update={"commit": second})
        assert read_spec_file(later, cache) == "resources: [{id: a}]\n"
        # a commit pushed after the cache was filled is fetched
        third = git.commit({"deploy/spec.yaml": "resources: [{id: b}]\n"})
        assert "id: b" in read_spec_file(at.model_copy(update={"commit": third}), cache)
        for path, says in [
            ("deploy/missing.yaml", "is not in commit"),
            ("deploy", "is a directory"),
            ("README/x", "is not a file"),
        ]:
            with pytest.raises(SpecError, match=says):
                read_spec_file(at.model_copy(update={"path": path}), cache)
        with pytest.raises(SpecError, match="is not in the repository"):
            read_spec_file(at.model_copy(update={"commit": "0" * 40}), cache)
        url = git.url
    with pytest.raises(SourceUnavailable, match=url.split("//")[1].split("/")[0]):
        read_spec_file(SourceRef(url=url, commit="1" * 40, path="s.yaml"), tmp_path / "c2")


def test_a_directory_is_read_at_the_head_of_a_branch(tmp_path: Path) -> None:
    with GitServer(tmp_path / "repo") as git:
        git.commit({"policies/a.rego": "package stackflow\n", "policies/lib/b.rego": "x\n"})
        head = git.commit({"policies/c.txt": "not rego\n", "README": "hi\n"})
        other = git.commit({"policies/a.rego": "changed\n"}, branch="next")
        commit, files = read_directory(git.url, "main", "policies", tmp_path / "c", ".rego")
        assert commit == head and files == {"a.rego": "package stackflow\n", "lib/b.rego": "x\n"}
        commit, files = read_directory(git.url, "next", "./policies/", tmp_path / "c", ".rego")
        assert commit == other and files["a.rego"] == "changed\n"
        with pytest.raises(SpecError, match="no branch gone"):
            read_directory(git.url, "gone", "policies", tmp_path / "c", ".rego")
        with pytest.raises(SpecError, match="missing is not in commit"):
            read_directory(git.url, "main", "missing", tmp_path / "c", ".rego")
        with pytest.raises(SpecError, match="is not a directory"):
            read_directory(git.url, "main", "README", tmp_path / "c", ".rego")


def test_a_push_must_be_the_branch_head_or_newer_than_the_last_one_run(tmp_path: Path) -> None:
    """The API's replay check (:func:`stackflow.state.git_sources.push_refusal`) against a real
    host."""
    from stackflow.state.git_sources import push_refusal

    cache = tmp_path / "cache"
    with GitServer(tmp_path / "repo") as git:
        first = git.commit({"spec.yaml": "a\n"})
        second = git.commit({"spec.yaml": "b\n"})
        aside = git.commit({"spec.yaml": "x\n"}, branch="feature")
        assert push_refusal(git.url, "main", second, first, cache) is None  # the head
        old = push_refusal(git.url, "main", first, second, cache)
        assert old == (
            f"commit {first[:12]} is not the head of refs/heads/main (now {second[:12]}) nor "
            f"newer than {second[:12]}, the last commit a delivery ran: an old delivery, "
            "replayed or late; nothing started"
        )
        assert push_refusal(git.url, "main", first, None, cache) is not None  # nothing to compare
        third = git.commit({"spec.yaml": "c\n"})
        git.commit({"README": "docs\n"})
        assert push_refusal(git.url, "main", third, second, cache) is None  # late, but newer
        assert push_refusal(git.url, "main", second, third, cache) is not None
        assert push_refusal(git.url, "main", aside, second, cache) is not None  # not on main
        assert "refs/heads/gone is not on" in str(push_refusal(git.url, "gone", first, None, cache))
