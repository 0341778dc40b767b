"""The dev loop's PostgreSQL (`make up`): reachable at STACKFLOW_POSTGRES_URL, as the
`stackflow` role on its own database, password-protected, on loopback only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.integration.conftest import require_env, require_port


@pytest.fixture(scope="session")
def stackflow_db_url() -> str:
    url = require_env("STACKFLOW_POSTGRES_URL")
    parts = urlsplit(url)
    require_port("PostgreSQL", f"{parts.hostname}:{parts.port or 5432}")
    return url


@pytest.fixture
def conn(stackflow_db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(stackflow_db_url, connect_timeout=5) as connection:
        yield connection


def test_url_names_the_stackflow_database_on_loopback(stackflow_db_url: str) -> None:
    parts = urlsplit(stackflow_db_url)
    assert parts.scheme == "postgresql"
    assert parts.hostname == "127.0.0.1"
    assert parts.username == "stackflow"
    assert parts.password, "the URL carries no password"
    assert parts.path == "/stackflow"


def test_connects_as_the_stackflow_role(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    row = conn.execute(
        "SELECT current_user, current_database(), r.rolcreatedb, r.rolsuper,"
        " pg_get_userbyid(d.datdba)"
        " FROM pg_roles r, pg_database d"
        " WHERE r.rolname = current_user AND d.datname = current_database()"
    ).fetchone()
    assert row == ("stackflow", "stackflow", True, False, "stackflow")


def test_temp_table_write_and_read(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute("CREATE TEMP TABLE smoke (id text PRIMARY KEY, payload jsonb NOT NULL)")
    key = uuid.uuid4().hex
    conn.execute(
        "INSERT INTO smoke (id, payload) VALUES (%s, %s::jsonb)", (key, '{"greeting": "hello"}')
    )
    conn.commit()
    row = conn.execute("SELECT payload->>'greeting' FROM smoke WHERE id = %s", (key,)).fetchone()
    assert row == ("hello",)


def test_role_can_create_tables_in_its_database(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    # What the state backend's migrations need: a regular table in the public schema.
    table = f"smoke_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE TABLE public.{table} (n integer)")
    conn.execute(f"INSERT INTO public.{table} VALUES (42)")
    assert conn.execute(f"SELECT n FROM public.{table}").fetchone() == (42,)
    conn.rollback()
    exists = conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()
    assert exists == (None,)


def test_listens_on_loopback_only(
    conn: psycopg.Connection[tuple[object, ...]], stackflow_db_url: str
) -> None:
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings"
        " WHERE name IN ('listen_addresses', 'port', 'password_encryption')"
    ).fetchall()
    settings = {str(name): str(value) for name, value in rows}
    assert settings["listen_addresses"] == "127.0.0.1"
    assert int(settings["port"]) == urlsplit(stackflow_db_url).port
    assert settings["password_encryption"] == "scram-sha-256"


def test_password_is_required(stackflow_db_url: str) -> None:
    parts = urlsplit(stackflow_db_url)
    wrong = stackflow_db_url.replace(f":{parts.password}@", ":not-the-password@", 1)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5).close()
    no_password = stackflow_db_url.replace(f":{parts.password}@", "@", 1)
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(no_password, connect_timeout=5, password="", passfile="/dev/null").close()
