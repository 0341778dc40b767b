"""The web UI for approvers, served by ``stackflow serve`` under ``/ui``: server-rendered pages
(Jinja2), one small script of its own for the live event stream, no build step and nothing
fetched from elsewhere. See docs/guide/web-ui.md."""

from __future__ import annotations

from fastapi import FastAPI


def install(app: FastAPI) -> None:
    """Add the UI's routes to the API ``app`` (its context is the API's own)."""
    from stackflow.api.ui import pages, signin
    from stackflow.api.ui.session import ui_secret

    app.state.ui_secret = ui_secret()
    app.include_router(signin.router)
    app.include_router(pages.router)
