"""A git repository served over smart HTTP on 127.0.0.1 (dulwich's WSGI server in a thread),
as a git host serves one: what the git-source tests fetch from."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from dulwich import porcelain
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import WSGIRequestHandlerLogger, WSGIServerLogger, make_server, make_wsgi_chain

AUTHOR = b"stackflow tests <tests@stackflow.invalid>"


class QuietHandler(WSGIRequestHandlerLogger):
    def log_message(self, format: str, *args: object) -> None:
        pass


class GitServer:
    """``url`` serves the repository at ``root``; :meth:`commit` writes files and commits
    them on a branch (``main`` by default)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = porcelain.init(str(root))
        refs: Any = self.repo.refs
        refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
        repos: dict[str, Any] = {"/repo.git": self.repo}
        app = make_wsgi_chain(DictBackend(repos))
        self.server = make_server(
            "127.0.0.1",
            0,
            app,
            handler_class=QuietHandler,
            server_class=WSGIServerLogger,
        )
        self.url = f"http://127.0.0.1:{self.server.server_port}/repo.git"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def commit(self, files: dict[str, str], message: str = "change", branch: str = "main") -> str:
        for name, text in files.items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        porcelain.add(self.repo, [str(self.root / name) for name in files])
        ref: Any = f"refs/heads/{branch}".encode()
        sha = self.repo.get_worktree().commit(
            message.encode(), committer=AUTHOR, author=AUTHOR, ref=ref
        )
        return bytes(sha).decode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.repo.close()

    def __enter__(self) -> GitServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["GitServer", "Repo"]
