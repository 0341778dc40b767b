"""`stackflow state migrate` (the state backend's schema, imports from older stackflow),
`stackflow keys new` and `stackflow codec-server`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stackflow.cli.api_mode import URL_ENV, api_mode
from stackflow.cli.app import EXIT_CODES_HELP, app
from stackflow.cli.output import stdout_console
from stackflow.core.crypto import KeyRing, new_key_line
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef

if TYPE_CHECKING:
    from stackflow.model.release import Release

state_app = typer.Typer(
    help="The state backend (STACKFLOW_STATE_URL): schema migrations and imports.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(state_app, name="state")

keys_app = typer.Typer(
    help="Encryption keys for payloads and state (STACKFLOW_ENCRYPTION_KEY).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")


@state_app.command("migrate")
def migrate(
    from_dir: Annotated[
        Path | None,
        typer.Option(
            "--from-dir",
            help="Also import the releases an earlier stackflow kept in this home "
            "(e.g. ~/.stackflow).",
        ),
    ] = None,
) -> None:
    """Bring the backend's schema up to date (idempotent); optionally import old releases.

    Through the API (STACKFLOW_API_URL) only --from-dir: the releases are imported with
    POST /v1/projects/{project}/releases/import (an approver's); the API's own backend is
    migrated by its workers when they start."""
    if not api_mode():
        from stackflow.state.backend import default_state_url, open_backend, redact_url

        url = default_state_url()
        backend = open_backend(url, migrate=True)
        revision = backend.head_revision()
        backend.close()
        stdout_console().print(f"{redact_url(url)}: schema at {revision}", highlight=False)
    elif from_dir is None:
        raise SpecError(
            f"`stackflow state migrate` migrates the schema of a state backend this machine "
            f"reaches; the HTTP API's ({URL_ENV}) is migrated by its workers when they start "
            "(`stackflow worker`) and GET /v1/readyz says whether it is ready. Unset "
            f"{URL_ENV} to migrate the backend STACKFLOW_STATE_URL names; through the API "
            "only `stackflow state migrate --from-dir DIR` works (it imports the releases)"
        )
    if from_dir is None:
        return
    from stackflow.cli import remote_releases
    from stackflow.state.legacy import read_legacy_home

    releases = read_legacy_home(from_dir.expanduser())  # by stack and revision
    stacks: dict[StackRef, list[Release]] = {}
    for release in releases:
        stacks.setdefault(release.stack_ref, []).append(release)
    imported = remote_releases.import_stacks(stacks)
    console = stdout_console()
    for stack, count in imported.items():
        console.print(f"imported {count} release(s) of {stack}", highlight=False)


@keys_app.command("new")
def keys_new(
    key_id: Annotated[
        str, typer.Option("--id", help="Key id (letters, digits, '.', '_', '-').")
    ] = "k1",
) -> None:
    """Print a fresh random AES-256 key as <id>:<base64>, the form STACKFLOW_ENCRYPTION_KEY takes.

    To rotate, put the new key first and keep the old one after it:
    STACKFLOW_ENCRYPTION_KEY=k2:...,k1:... (the first is current).
    """
    line = new_key_line(key_id)
    KeyRing.parse(line, "--id")  # a bad id is one error line (exit 2), not a key
    sys.stdout.write(line + "\n")


@app.command("codec-server")
def codec_server(
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 18081,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback).")] = "127.0.0.1",
    origin: Annotated[
        list[str] | None,
        typer.Option("--origin", help="Web UI origin allowed by CORS (repeat)."),
    ] = None,
) -> None:
    """Serve Temporal's remote codec (/encode, /decode) for the Web UI and the temporal CLI.

    Keys: STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE. Who may decode: a
    bearer token (STACKFLOW_CODEC_TOKEN) and/or OIDC access tokens (STACKFLOW_CODEC_OIDC_ISSUER,
    _AUDIENCE, _JWKS_URL); with neither it listens on loopback only (exit 2 otherwise).
    HTTPS: STACKFLOW_CODEC_TLS_CERT and STACKFLOW_CODEC_TLS_KEY (PEM files).
    Default origin: STACKFLOW_TEMPORAL_UI or the dev UI.
    """
    import os

    from stackflow.temporal.codec_server import CodecAuth, serve

    origins = origin or [os.environ.get("STACKFLOW_TEMPORAL_UI", "http://127.0.0.1:8233")]
    origins = [o.rstrip("/") for o in origins]
    auth = CodecAuth.from_env()
    server = serve(host, port, origins, auth)
    scheme = "https" if os.environ.get("STACKFLOW_CODEC_TLS_CERT", "").strip() else "http"
    stdout_console().print(
        f"stackflow codec server on {scheme}://{host}:{server.server_address[1]} "
        f"(origins {', '.join(origins)}; {auth.describe()})",
        highlight=False,
        soft_wrap=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
