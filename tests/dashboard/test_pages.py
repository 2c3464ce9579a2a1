"""Every page and JSON endpoint over a live in-process fleet: what it shows is the CLI's answer."""

from __future__ import annotations

import asyncio
import uuid

import tests.dashboard.flows as d
import tests.flows.flows as f
from runfleet.ops.dashboard.models import OverviewView, StepsView
from runfleet.ops.dashboard.urls import run_url
from runfleet.ops.models import Explanation, FleetView, JournalView, RunDetail, RunList, TreeView
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.dashboard.conftest import Dash
from tests.flows.conftest import parked
from tests.support.polling import until


async def test_every_page_and_api_renders_what_the_fleet_did(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    tag = uuid.uuid4().hex[:6]
    stepped = await queue.enqueue(f.steps, tag)
    asking = await queue.enqueue(f.approver, 3)
    await parked(store, stepped.id, "event")
    await parked(store, asking.id, "approval")
    await queue.complete(stepped.id, "go")
    await stepped.result(timeout=10)

    # overview: the worker, the queue's counts, the settlement in the chart
    async def settled_in_chart() -> OverviewView | None:
        r = await client.get("/api/overview")
        assert r.status_code == 200, r.text
        view = OverviewView.model_validate_json(r.text)
        completed = sum(view.charts[0].series[0].values)
        return view if completed >= 1 else None

    view = await until(settled_in_chart, 10, "the settlement to be charted")
    assert view.fleet is not None and [w.pid for w in view.fleet.workers] == [worker.owner.pid]
    (default,) = [q for q in view.queues if q.queue == "default"]
    assert (default.completed, default.suspended) == (1, 1)
    assert view.totals["completed"] == 1 and view.totals["suspended"] == 1
    page = await client.get("/")
    assert page.status_code == 200 and "<svg" in page.text and "settled per 10 s" in page.text
    assert f"<td>{worker.owner.pid}</td>" in page.text
    assert page.headers["set-cookie"].startswith("rf_csrf=")

    # /runs and its filters, as `runfleet runs` filters
    listing = RunList.model_validate_json((await client.get("/api/runs")).text)
    assert {r.id for r in listing.runs} == {stepped.id, asking.id}
    done = RunList.model_validate_json((await client.get("/api/runs?status=completed")).text)
    assert [r.id for r in done.runs] == [stepped.id]
    by_flow = RunList.model_validate_json((await client.get("/api/runs?flow=t.approver")).text)
    assert [r.id for r in by_flow.runs] == [asking.id]
    other = RunList.model_validate_json((await client.get("/api/runs?queue=other")).text)
    assert other.runs == []
    recent = RunList.model_validate_json((await client.get("/api/runs?since=1h&limit=1")).text)
    assert [r.id for r in recent.runs] == [asking.id]  # newest first
    html = await client.get("/runs?status=suspended")
    assert html.status_code == 200
    assert f'href="/runs/{asking.id}"' in html.text and stepped.id not in html.text
    assert (await client.get("/runs?since=yesterdayish")).status_code == 400
    assert (await client.get("/api/runs?status=bogus")).status_code == 400

    # one run: explain text, timeline, steps with attempts, tree, journal
    page = await client.get(f"/runs/{stepped.id}")
    assert page.status_code == 200
    assert f"run {stepped.id} (t.steps on queue default) is completed" in page.text
    assert 'class="timeline"' in page.text and 'data-kind="claimed-and-activated"' in page.text
    assert "step:b" in page.text and "#3" in page.text  # b failed twice, recorded at attempt 3
    steps = StepsView.model_validate_json((await client.get(f"/api/runs/{stepped.id}/steps")).text)
    b = next(s for s in steps.steps if s.name == "b")
    assert [a.attempt for a in b.attempts] == [1, 2, 3]
    assert [a.error is not None for a in b.attempts] == [True, True, False]
    detail = RunDetail.model_validate_json((await client.get(f"/api/runs/{stepped.id}")).text)
    assert detail.run.status is RunStatus.COMPLETED
    why = Explanation.model_validate_json((await client.get(f"/api/runs/{asking.id}/explain")).text)
    assert why.run.waiting is not None and why.run.waiting.reason == "approval"
    journal = JournalView.model_validate_json(
        (await client.get(f"/api/runs/{stepped.id}/journal")).text
    )
    kinds = [e.kind for e in journal.entries]
    assert kinds[0] == "created" and "parked" in kinds and kinds[-1] == "transitioned"
    tree = TreeView.model_validate_json((await client.get(f"/api/runs/{asking.id}/tree")).text)
    assert tree.run.id == asking.id and tree.waiting[0].reason == "approval"

    # the live fragment is the page's live part only
    part = await client.get(f"/runs/{asking.id}", headers={"X-Partial": "1"})
    assert part.status_code == 200 and "<html" not in part.text and 'id="explain"' in part.text

    # fleet
    fleet = FleetView.model_validate_json((await client.get("/api/fleet")).text)
    assert [w.pid for w in fleet.workers] == [worker.owner.pid]
    page = await client.get("/fleet")
    assert page.status_code == 200 and f'data-pid="{worker.owner.pid}"' in page.text

    # mistakes a user can make: one sentence and a status code
    missing = await client.get("/runs/nope")
    assert missing.status_code == 404 and "no run with id" in missing.text
    assert (await client.get("/api/runs/nope/explain")).status_code == 404


async def test_the_fleet_page_lists_the_runs_each_worker_owns(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    run = await queue.enqueue(d.busy, 30)

    async def running() -> bool:
        row = await store.runs.get(run.id)
        return row is not None and row.status is RunStatus.RUNNING

    await until(running, 10, "the run to start")
    page = await client.get("/fleet")
    assert f'href="/runs/{run.id}"' in page.text
    await queue.cancel(run.id)
    await asyncio.wait_for(_settled(store, run.id), 10)


async def _settled(store: Store, run_id: str) -> None:
    async def check() -> bool:
        row = await store.runs.get(run_id)
        return row is not None and row.status.terminal

    await until(check, 10, f"run {run_id} to settle")


async def test_a_host_name_not_allowed_is_refused(dashboard: Dash) -> None:
    """DNS rebinding: a hostile name resolving to 127.0.0.1 does not reach the app."""
    client = await dashboard()
    r = await client.get("/", headers={"host": "evil.example"})
    assert r.status_code == 400


async def test_the_run_page_draws_children_rounds_and_what_it_waits_on(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    parent = await queue.enqueue(f.parent, 1)
    await parked(store, parent.id, "child")
    tree = TreeView.model_validate_json((await client.get(f"/api/runs/{parent.id}/tree")).text)
    children = {n.run.id: n for n in tree.children}
    assert len(children) == 2 and {n.attached for n in children.values()} == {True, False}
    page = (await client.get(f"/runs/{parent.id}", headers={"X-Partial": "1"})).text
    tree_html = page.split('<div id="tree">', 1)[1].split("</div>", 1)[0]
    for child in children:  # a child's id holds '/' and '#': one encoded path segment
        assert f'href="{run_url(child)}"' in tree_html and "%2F" in run_url(child)
    assert "(detached)" in tree_html and "waiting on:" in tree_html
    for child in children:
        await queue.complete(child, "release")
    await parent.result(timeout=10)

    chain = await queue.enqueue(f.rounds, 2)
    await chain.result(timeout=10)
    tree = TreeView.model_validate_json((await client.get(f"/api/runs/{chain.id}/tree")).text)
    assert [r.round_ordinal for r in tree.rounds] == [0, 1, 2]
    page = (await client.get(f"/runs/{chain.id}")).text
    assert "rounds of lineage" in page and "← this run" in page
    for r in tree.rounds:
        assert f'href="/runs/{r.id}"' in page
