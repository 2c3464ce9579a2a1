"""CSRF protection for a local operator tool: same-origin POSTs carrying a per-session token.

A page on another site can make the operator's browser POST to ``127.0.0.1:8080``;
two checks refuse it: the ``Origin`` (or, failing that, ``Referer``) must name the
host the request was sent to, and the form must echo the token kept in a
``SameSite=Strict``, ``HttpOnly`` cookie (another origin can neither read nor send it).
DNS rebinding (a hostile name resolving to 127.0.0.1, which would make the attacker
same-origin) is refused earlier, by the allowed-hosts check on ``Host``.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "rf_csrf"
FIELD = "csrf"


def token(request: Request) -> str:
    """The session's token (a new one if the browser has none yet)."""
    current = request.cookies.get(COOKIE)
    if current and len(current) >= 32:
        return current
    if not hasattr(request.state, "csrf_new"):
        request.state.csrf_new = secrets.token_urlsafe(32)
    return str(request.state.csrf_new)


def remember(request: Request, response: Response) -> Response:
    """Set the cookie when this response handed out a new token."""
    new = getattr(request.state, "csrf_new", None)
    if new:
        response.set_cookie(COOKIE, new, httponly=True, samesite="strict", path="/")
    return response


def refusal(request: Request, sent: str | None) -> str | None:
    """Why a POST is refused (None: it may proceed)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return "no Origin or Referer header: the request's page is unknown"
    host = request.headers.get("host", "")
    if urlsplit(origin).netloc != host:
        return f"cross-origin request from {origin!r} refused"
    cookie = request.cookies.get(COOKIE)
    if not cookie or not sent or not hmac.compare_digest(cookie, sent):
        return "missing or wrong CSRF token: reload the page and try again"
    return None
