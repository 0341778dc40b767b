"""The real API app over ASGI on a real SQLite backend, with an approver (``admin``), an
operator and a viewer: the fixtures the unit tests of API calls that need no Temporal share."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stackflow.api.app import create_app
from stackflow.api.auth import parse_tokens
from stackflow.state.backend import StateBackend, open_backend

TOKENS = {"admin": "approver", "viewer": "viewer", "operator": "operator"}


def no_temporal(why: str) -> Callable[[], Any]:
    """A Temporal connector that fails the test: ``why`` the calls never need Temporal."""

    async def connect() -> Any:
        raise AssertionError(why)

    return connect


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateBackend]:
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    yield backend
    backend.close()


async def asgi_client(store: StateBackend, why: str) -> AsyncIterator[httpx.AsyncClient]:
    table = parse_tokens(
        json.dumps(
            [
                {
                    "name": name,
                    "sha256": hashlib.sha256(f"{name}-token".encode()).hexdigest(),
                    "roles": {"*": role},
                }
                for name, role in TOKENS.items()
            ]
        )
    )
    app = create_app(no_temporal(why), store, table)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


def auth(name: str = "admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {name}-token"}


def problem(r: httpx.Response, status: int) -> str:
    """The one-line detail of a problem+json answer of ``status``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    detail: str = r.json()["detail"]
    assert "\n" not in detail
    return detail
