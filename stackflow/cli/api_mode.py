"""The CLI's one transport: the typed client (``stackflow.client``) of `stackflow serve` at
``STACKFLOW_API_URL`` with the token in ``STACKFLOW_API_TOKEN`` (API mode: this machine needs
no Temporal address, database URL or encryption key), or, without it, of the API in this
process on the environment's Temporal and state backend (:mod:`stackflow.api.local`): the
same code either way. What needs the state backend itself (``state migrate``, ``output
--show-sensitive``, ``policy eval``) refuses in API mode with one line (exit 2); the server
processes (``worker``, ``serve``, ``codec-server``) are configured by their environment."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from stackflow.core.errors import SpecError

if TYPE_CHECKING:
    from stackflow.client import StackflowClient

URL_ENV = "STACKFLOW_API_URL"


def api_mode() -> bool:
    return bool(os.environ.get(URL_ENV, "").strip())


def api_client(patience: float = 0.0) -> StackflowClient:
    """The client of ``STACKFLOW_API_URL`` with ``STACKFLOW_API_TOKEN`` (exit 2 without it),
    or, without ``STACKFLOW_API_URL``, of the API in this process (:mod:`stackflow.api.local`)
    on the environment's Temporal and state backend. ``patience``: the seconds of a Temporal
    outage it waits out (``--unavailable-timeout``), saying so on a terminal."""
    from stackflow.client import StackflowClient

    if api_mode():
        client = StackflowClient.from_env()
    else:
        from stackflow.api.local import BASE_URL, LocalTransport
        from stackflow.cli.runs import current_user

        transport = LocalTransport(current_user())
        client = StackflowClient(BASE_URL, transport.token, transport=transport)
    client.patience = patience
    client.notice = _notice
    return client


def _notice(text: str) -> None:
    """A progress note on stderr, for a person at a terminal only (scripts get the one
    ``Error:`` line or nothing)."""
    if sys.stderr.isatty():
        from stackflow.cli.output import echo_safe

        echo_safe(text, err=True)


def refuse_in_api_mode(command: str) -> None:
    """Exit 2 with one line when ``command`` cannot go through the API and it is set."""
    if api_mode():
        raise SpecError(
            f"`stackflow {command}` does not go through the HTTP API: unset {URL_ENV} and run "
            "it where Temporal and the state backend are reachable"
        )


def not_through_api(option: str) -> SpecError:
    return SpecError(
        f"{option} is not available through the HTTP API ({URL_ENV} is set): leave it out, "
        f"or unset {URL_ENV} to run the command where the state backend is reachable"
    )
