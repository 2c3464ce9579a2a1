"""The dashboard's routes under every valid run id: each page and button reaches that run.

Hypothesis draws ids of every shape the store accepts (``valid_run_ids``: children,
rounds, dot segments, ``?``, ``#``, ``%``, ``\\``, any Unicode). Each is admitted with
decoys named after the prefixes a misread link would reach; then its link in the runs
list, the run page (whole and live part), every JSON part, and the cancel form as the
page writes it are followed as a browser resolves them. Each must answer for that run —
never a 404, 405 or 500 — and the cancel must request the cancellation of that run only.
"""

from __future__ import annotations

import re
import uuid
from html import unescape

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from pydantic import BaseModel

from runfleet.ops.dashboard.models import LifecycleView, StepsView
from runfleet.ops.dashboard.urls import PARTS, run_url
from runfleet.ops.models import Explanation, JournalView, RunDetail, TreeView
from runfleet.store import Store, validate
from runfleet.store.types import NewRun
from tests.dashboard.conftest import BASE, Dash, browser_path
from tests.security_fuzz.strategies import valid_run_ids

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FAR = 10**13
"""A start time centuries ahead: the runs stay pending, no worker is needed."""
CANCEL_FORM = (
    r'<form class="inline" method="post" action="([^"]+)">\s*<input[^>]*>\s*'
    r'<button type="submit" id="cancel">'
)
_PART_ID: dict[str, tuple[type[BaseModel], str]] = {
    "explain": (Explanation, "run.id"),
    "journal": (JournalView, "run_id"),
    "tree": (TreeView, "run.id"),
    "steps": (StepsView, "run_id"),
    "lifecycle": (LifecycleView, "run_id"),
}


@pytest.fixture
async def client(dashboard: Dash) -> httpx.AsyncClient:
    return await dashboard()


def _decoys(run_id: str) -> set[str]:
    """The runs a link misread at a ``/``, ``?``, ``#``, ``\\`` or ``%`` would reach."""
    found = {run_id.split(mark, 1)[0] for mark in "/?#\\%"} | {run_id.rsplit("/", 1)[0]}
    found |= {run_id.replace("\\", "/"), run_id.rstrip("/."), "victim"}
    ok = set()
    for decoy in found - {run_id}:
        try:
            ok.add(validate.identifier("run_id", decoy))
        except ValueError:
            pass
    return ok


async def _admit(store: Store, run_id: str, flow: str) -> str:
    """The run's flow (an id drawn twice keeps its first run)."""
    row = await store.runs.get(run_id)
    if row is not None:
        return row.flow
    await store.admission.create(NewRun(id=run_id, flow=flow, delay_until_ms=FAR))
    return flow


def _field(model: BaseModel, path: str) -> object:
    value: object = model
    for name in path.split("."):
        value = getattr(value, name)
    return value


@FUZZ
@given(run_id=valid_run_ids)
@example(run_id="victim/cancel?")
@example(run_id="x\\..\\victim")
@example(run_id="..")
@example(run_id=".")
@example(run_id="victim/explain")
@example(run_id="p/child:f#1")
@example(run_id="%2F")
async def test_every_route_reaches_the_run_of_every_valid_id(
    store: Store, client: httpx.AsyncClient, run_id: str
) -> None:
    for decoy in _decoys(run_id):
        await _admit(store, decoy, "fuzz.decoy")
    flow = await _admit(store, run_id, f"fuzz.{uuid.uuid4().hex[:12]}")

    listing = await client.get("/runs", params={"flow": flow})
    assert listing.status_code == 200, listing.text[:300]
    rows = re.findall(r'data-id="([^"]*)"[^>]*><td><a class="mono" href="([^"]+)">', listing.text)
    (href,) = [link for shown, link in rows if unescape(shown) == run_id]
    page = await client.get(browser_path(href))
    assert page.status_code == 200, (href, page.status_code, page.text[:300])
    live = await client.get(browser_path(href), headers={"X-Partial": "1"})
    assert live.status_code == 200, (href, live.status_code)

    detail = await client.get(run_url(run_id, api=True))
    assert detail.status_code == 200, detail.text[:300]
    assert RunDetail.model_validate_json(detail.text).run.id == run_id
    for part in PARTS:
        got = await client.get(run_url(run_id, part, api=True))
        assert got.status_code == 200, (part, got.status_code, got.text[:300])
        model, path = _PART_ID[part]
        assert _field(model.model_validate_json(got.text), path) == run_id, part

    before = {r.id for r in await store.inspect.list_runs(limit=10_000) if r.cancel_requested_at_ms}
    forms = re.findall(CANCEL_FORM, page.text)
    if run_id in before:  # a decoy of an earlier example, cancelled then: no cancel fits now
        assert forms == [], (run_id, forms)
        return
    action = forms[0]
    token = re.findall(r'name="csrf" value="([^"]+)"', page.text)[0]
    done = await client.post(
        browser_path(action),
        data={"csrf": token},
        headers={"origin": BASE, "referer": BASE + browser_path(href)},
    )
    assert done.status_code == 303, (unescape(action), done.status_code, done.text[:300])
    after = {r.id for r in await store.inspect.list_runs(limit=10_000) if r.cancel_requested_at_ms}
    assert after - before <= {run_id} and run_id in after, (after - before, run_id)
    back = await client.get(browser_path(done.headers["location"]))
    assert back.status_code == 200 and 'id="done"' in back.text, done.headers["location"]
