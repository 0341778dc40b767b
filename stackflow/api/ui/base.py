"""What every page of the web UI shares: the templates (autoescaped; control characters shown
as escapes, never passed to the terminal or the page as they are), the security headers (a
strict Content-Security-Policy: scripts and styles from ``/ui/static`` only, nothing from
elsewhere), the signed-in person, the CSRF check of a form, and errors rendered as a page."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
import markupsafe
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from stackflow.api.context import ApiContext
from stackflow.api.identity import AuthUnavailable, Identity
from stackflow.api.problems import Problem, status_of, validation_detail
from stackflow.api.ui import session
from stackflow.core.errors import StackflowError

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def inert(value: Any) -> Any:
    """Every value a template prints: control and bidi characters as visible escapes."""
    if value is None:
        return ""
    if isinstance(value, markupsafe.Markup):  # a macro's output: already made inert
        return value
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    finalize=inert,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["seg"] = lambda value: quote(str(value), safe="")


class SignIn(Exception):
    """No session: the page sends the person to sign in (and back)."""


def ctx_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def secret_of(request: Request) -> bytes:
    secret: bytes = request.app.state.ui_secret
    return secret


def current(request: Request) -> tuple[session.Session | None, Identity | None]:
    found = session.read(request, secret_of(request))
    if found is None:
        return None, None
    return found, found.identity(ctx_of(request).tokens)


def signed_in(request: Request) -> tuple[session.Session, Identity]:
    found, identity = current(request)
    if found is None or identity is None:
        raise SignIn()
    return found, identity


async def posted(request: Request) -> tuple[session.Session, Identity, dict[str, str]]:
    """The signed-in person and the form they posted, once its CSRF token is the session's."""
    found, identity = signed_in(request)
    fields = await form(request)
    if not found.check_csrf(fields.get("csrf")):
        raise Problem(403, "the form's CSRF token is missing or wrong: reload the page", "csrf")
    return found, identity, fields


async def form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the UI's forms post nothing else)."""
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def render(request: Request, name: str, code: int = 200, **values: Any) -> HTMLResponse:
    found, identity = current(request)
    html = templates.get_template(name).render(
        request=request, me=identity, csrf=found.csrf if found else "", **values
    )
    return HTMLResponse(html, status_code=code)


def error_page(request: Request, status: int, detail: str) -> HTMLResponse:
    return render(request, "error.html", code=status, status_code=status, detail=detail)


class UiRoute(APIRoute):
    """A UI route: its errors are a page (never problem+json), no session sends the person
    to sign in, and every answer carries the security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                response = await handler(request)
            except SignIn:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                response = RedirectResponse(f"/ui/login?next={quote(target, safe='')}", 303)
            except Problem as err:
                response = error_page(request, err.status, err.detail)
            except AuthUnavailable as err:
                response = error_page(request, 503, str(err))
            except StackflowError as err:
                response = error_page(request, status_of(err)[0], str(err))
            except RequestValidationError as err:
                response = error_page(request, *validation_detail(err))
            for name, value in HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return page
