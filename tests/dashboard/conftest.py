"""The dashboard app in the test's own event loop, over the test's database and Redis prefix.

``dashboard(scopes=...)`` opens an app (its lifespan: pool, Redis, producer queue) and
an httpx client that talks to it in-process; POSTs carry the same-origin headers and
the CSRF cookie/token a browser page would.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import httpx
import pytest

import tests.flows.flows as f
from runfleet.ops.dashboard.app import create_app
from runfleet.store.config import Settings
from runfleet.store.types import RunRow

BASE = "http://testserver"
Dash = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def dashboard(settings: Settings) -> AsyncIterator[Dash]:
    async with AsyncExitStack() as stack:

        async def open_one(scopes: tuple[str, ...] = ()) -> httpx.AsyncClient:
            app = create_app(settings, scopes=scopes, allowed_hosts=("testserver",))
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            return await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url=BASE)
            )

        yield open_one


_DOT = re.compile(r"\A(?:\.|%2e)\Z", re.IGNORECASE)
_DOTDOT = re.compile(r"\A(?:\.|%2e){2}\Z", re.IGNORECASE)


def browser_path(href: str) -> str:
    """An ``href`` or form ``action`` (an absolute path, as the HTML has it) as a browser
    sends it (WHATWG URL parsing): ``\\`` is ``/``, the fragment stays behind, ``.`` and
    ``..`` segments (``%2e`` too) are resolved. A link that points at another run once it
    is resolved points at another run, whatever the server would make of the raw text."""
    target = html.unescape(href).replace("\\", "/").split("#", 1)[0]
    path, sep, query = target.partition("?")
    out: list[str] = []
    segments = path.split("/")[1:]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if _DOTDOT.match(seg):
            if out:
                out.pop()
            if last:
                out.append("")
        elif _DOT.match(seg):
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out) + sep + query


async def post(client: httpx.AsyncClient, path: str, **form: str) -> httpx.Response:
    """A button press as the browser sends it: the page's token, same-origin headers."""
    page = await client.get(path.rsplit("/", 1)[0])
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the run page carries a CSRF token"
    return await client.post(
        path,
        data={"csrf": found.group(1), **form},
        headers={"origin": BASE, "referer": BASE + path},
    )


def approval_token(row: RunRow) -> str:
    """The token the approver was sent: ``on_token``'s delivery where the test flow records
    it (the waiting row then keeps only a hash), else the one the waiting row shows."""
    delivered: dict[str, str] | None = getattr(f, "TOKENS", None)
    if delivered is not None:
        return delivered[row.id]
    assert row.waiting is not None and row.waiting.token
    return row.waiting.token


def mentions_dashboard(payload: object) -> bool:
    """The journaled decision names the dashboard as who asked (as actor, or as a note
    beside the authenticated role that decided)."""
    return "dashboard:" in str(payload)
