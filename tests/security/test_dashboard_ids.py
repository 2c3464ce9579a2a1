"""Every run id a tenant may choose points at itself on the dashboard.

A producer admits runs whose ids a browser would misread in a raw link: ``?`` starts a
query, ``#`` a fragment, ``\\`` is read as ``/`` and ``..`` climbs a level, so the
cancel form of ``victim/cancel?`` or ``x\\..\\victim`` would post to the victim's own
cancel address. The dashboard runs as that producer. For each id, the test follows
the links and forms of the pages as a browser resolves them (``browser_path``), and
checks that each page shows that run and that its cancel button cancels that run
and no other; a child run (whose id holds ``/``) opens and answers like any other.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from html import unescape

import httpx
import pytest

from runfleet.ops.dashboard.app import create_app
from runfleet.ops.models import RunDetail
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.roles import GroupRole
from tests.dashboard.conftest import browser_path
from tests.security.conftest import MakeLogin
from tests.security.test_roles import waiting_for_event

pytestmark = pytest.mark.usefixtures("role_worker")

BASE = "http://testserver"
VICTIM = "victim"
HOSTILE = [
    "victim/cancel?",
    "x\\..\\victim",
    "victim#",
    "victim?",
    "victim/explain",
    "..",
    ".",
    "100%25 & más/ü #1",
    "\u202evictim",
]
CANCEL_FORM = (
    r'<form class="inline" method="post" action="([^"]+)">\s*<input[^>]*>\s*'
    r'<button type="submit" id="cancel">'
)


def _one(pattern: str, html: str) -> str:
    found = re.findall(pattern, html)
    assert len(found) == 1, (pattern, found)
    return str(found[0])


@pytest.fixture
async def producer(login: MakeLogin) -> Settings:
    return (await login(GroupRole.PRODUCER, "s1")).settings


@pytest.fixture
async def client(producer: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The dashboard acting as the producer login, as ``runfleet dashboard --scope s1``."""
    app = create_app(producer, scopes=("s1",), allowed_hosts=("testserver",))
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url=BASE))


async def _page_of(client: httpx.AsyncClient, href: str, run_id: str) -> str:
    page = await client.get(browser_path(href))
    assert page.status_code == 200, (run_id, href, page.status_code, page.text[:300])
    api = await client.get(browser_path(_api_href(page.text)))
    assert RunDetail.model_validate_json(api.text).run.id == run_id, (href, api.text[:300])
    return page.text


def _api_href(html: str) -> str:
    """The run page's own JSON: its cancel form's address, as /api/... without the action."""
    action = unescape(_one(CANCEL_FORM, html))
    if action.startswith("/run/"):  # the query form: /run/cancel?id=...
        return "/api/run?" + action.split("?", 1)[1]
    return "/api" + action.rsplit("/", 1)[0]


async def _cancel_from(client: httpx.AsyncClient, html: str) -> httpx.Response:
    action = _one(CANCEL_FORM, html)
    token = re.findall(r'name="csrf" value="([^"]+)"', html)[0]
    return await client.post(
        browser_path(action),
        data={"csrf": token},
        headers={"origin": BASE, "referer": BASE + "/runs"},
    )


async def test_every_run_id_points_at_its_own_run(
    producer: Settings, client: httpx.AsyncClient
) -> None:
    async with AsyncQueue("default", settings=producer, scopes=["s1"]) as q:
        for run_id in [VICTIM, *HOSTILE]:
            await q.enqueue("sec.full", run_id, run_id=run_id)
        for run_id in [VICTIM, *HOSTILE]:
            await waiting_for_event(q, run_id)
        (edge,) = await q.store.dag.children(VICTIM)
        child = edge.child_id
        assert "/child:" in child and "#" in child

        listing = (await client.get("/runs")).text
        hrefs = {
            unescape(text): href
            for href, text in re.findall(r'<a class="mono" href="([^"]+)">([^<]+)</a>', listing)
        }
        for run_id in HOSTILE:
            shown = run_id.replace("\u202e", "\\u202e")  # the link's text: bidi shown escaped
            html = await _page_of(client, hrefs[shown], run_id)
            done = await _cancel_from(client, html)
            assert done.status_code == 303, (run_id, done.status_code, done.text[:300])
            after = await client.get(browser_path(done.headers["location"]))
            assert after.status_code == 200 and 'id="done"' in after.text, run_id
            row = await q.store.runs.get(run_id)
            assert row is not None and row.cancel_requested_at_ms is not None, run_id
            victim = await q.store.runs.get(VICTIM)
            assert victim is not None and victim.cancel_requested_at_ms is None, run_id

        # A child run: its id holds '/' and '#'; its link (from the parent's tree) opens it.
        parent_page = await client.get(browser_path(hrefs[VICTIM]))
        child_href = _one(r'<a class="mono" href="([^"]+)">[^<]*child:[^<]*</a>', parent_page.text)
        page = await client.get(browser_path(child_href))
        assert page.status_code == 200, (child_href, page.status_code, page.text[:300])
        shown = unescape(_one(r'<h1>Run <span class="mono">([^<]+)</span>', page.text))
        assert shown == child, (shown, child)
        html = page.text
        row = await q.store.runs.get(child)
        assert row is not None and row.status.terminal  # the child completed: nothing to cancel
        assert 'id="cancel"' not in html  # and its page offers no cancel (the fitting actions)
        victim = await q.store.runs.get(VICTIM)
        assert victim is not None and victim.cancel_requested_at_ms is None
