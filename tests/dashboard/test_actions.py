"""The buttons: the CLI's calls, journaled as the dashboard, refused across origins and scopes."""

from __future__ import annotations

import uuid

import psycopg

import tests.dashboard.flows as d
import tests.flows.flows as f
from runfleet.ops.models import CancelResult
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.dashboard.conftest import BASE, Dash, approval_token, mentions_dashboard, post
from tests.flows.conftest import parked
from tests.support.polling import until


async def _status(store: Store, run_id: str, status: RunStatus) -> None:
    async def check() -> bool:
        row = await store.runs.get(run_id)
        return row is not None and row.status is status

    await until(check, 10, f"run {run_id} to be {status.value}")


async def _cancel_requests(store: Store, run_id: str) -> list[object]:
    return [r.payload for r in await store.journal.records(run_id) if r.kind == "cancel-requested"]


async def test_cancel_approve_deny_resume_go_through_the_queue_and_the_journal(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    busy = await queue.enqueue(d.busy, 30)
    await _status(store, busy.id, RunStatus.RUNNING)
    r = await post(client, f"/runs/{busy.id}/cancel")
    assert r.status_code == 303 and r.headers["location"] == f"/runs/{busy.id}?done=requested"
    await _status(store, busy.id, RunStatus.CANCELLED)
    (request,) = await _cancel_requests(store, busy.id)
    assert mentions_dashboard(request)
    page = await client.get(r.headers["location"])
    assert "cancellation requested" in page.text and 'data-status="cancelled"' in page.text
    again = await post(client, f"/runs/{busy.id}/cancel")
    assert again.headers["location"].endswith("?done=already-terminal")

    asking = await queue.enqueue(f.approver, 5)
    token = approval_token(await parked(store, asking.id, "approval"))
    wrong = await post(client, f"/runs/{asking.id}/deny", token="nope")
    assert wrong.status_code == 400 and "not waiting for" in wrong.text
    bad_value = await post(client, f"/runs/{asking.id}/approve", token=token, value="{")
    assert bad_value.status_code == 400 and "not valid JSON" in bad_value.text
    ok = await post(client, f"/runs/{asking.id}/approve", token=token, value='{"cap": 2}')
    assert ok.status_code == 303, ok.text
    result = await asking.result(timeout=10)
    assert result["approved"] is True and result["value"] == {"cap": 2}
    (approved,) = [
        r for r in await store.journal.records(asking.id) if r.kind == Kind.APPROVAL_APPROVED
    ]
    assert mentions_dashboard(approved.payload)

    denied = await queue.enqueue(f.approver, 6)
    token = approval_token(await parked(store, denied.id, "approval"))
    r = await post(client, f"/runs/{denied.id}/deny", token=token, reason="too much")
    assert r.status_code == 303
    assert (await denied.result(timeout=10))["approved"] is False

    stepped = await queue.enqueue(f.steps, uuid.uuid4().hex[:6])
    await parked(store, stepped.id, "event")
    not_quarantined = await post(client, f"/runs/{stepped.id}/resume")
    assert not_quarantined.status_code == 400 and "not quarantined" in not_quarantined.text

    # the same answer as JSON, as `runfleet cancel --json` prints it
    page = await client.get(f"/runs/{stepped.id}")
    token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    as_json = await client.post(
        f"/runs/{stepped.id}/cancel",
        data={"csrf": token},
        headers={"origin": BASE, "accept": "application/json"},
    )
    assert CancelResult.model_validate_json(as_json.text).outcome == "requested"
    await _status(store, stepped.id, RunStatus.CANCELLED)


async def test_forged_posts_are_refused_and_change_nothing(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    busy = await queue.enqueue(d.busy, 30)
    await _status(store, busy.id, RunStatus.RUNNING)
    page = await client.get(f"/runs/{busy.id}")
    token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    path = f"/runs/{busy.id}/cancel"
    attempts = {
        "no origin": ({"csrf": token}, {}),
        "another site": ({"csrf": token}, {"origin": "http://evil.example"}),
        "no token": ({}, {"origin": BASE}),
        "wrong token": ({"csrf": "x" * 43}, {"origin": BASE}),
    }
    for what, (form, headers) in attempts.items():
        r = await client.post(path, data=form, headers=headers)
        assert r.status_code == 403, what
    # a page on another site cannot send the cookie either: a fresh client has none
    cookieless = await dashboard()
    r = await cookieless.post(path, data={"csrf": token}, headers={"origin": BASE})
    assert r.status_code == 403 and "CSRF" in r.text
    assert await _cancel_requests(store, busy.id) == []
    row = await store.runs.get(busy.id)
    assert row is not None and row.cancel_requested_at_ms is None
    await queue.cancel(busy.id)


async def test_buttons_hold_the_dashboards_scopes_only(
    worker: Worker, settings: Settings, store: Store, dashboard: Dash
) -> None:
    async with AsyncQueue("default", settings=settings, scopes=["team-a"]) as team_a:
        busy = await team_a.enqueue(d.busy, 30)
        await _status(store, busy.id, RunStatus.RUNNING)
        for scopes in [(), ("team-b",)]:
            outsider = await dashboard(scopes=scopes)
            r = await post(outsider, f"/runs/{busy.id}/cancel")
            assert r.status_code == 403 and "needs scopes the caller lacks" in r.text, scopes
        assert await _cancel_requests(store, busy.id) == []
        member = await dashboard(scopes=("team-a",))
        r = await post(member, f"/runs/{busy.id}/cancel")
        assert r.status_code == 303
        await _status(store, busy.id, RunStatus.CANCELLED)


async def test_resume_moves_a_quarantined_run_on(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings, dashboard: Dash
) -> None:
    client = await dashboard()
    run = await queue.enqueue(f.steps, uuid.uuid4().hex[:6])
    await parked(store, run.id, "event")
    # a recorded output that no longer matches its digest (as the CLI's resume test does)
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(
            "UPDATE runfleet.steps SET output = '5' WHERE run_id = %s AND key = 'step:a#1'",
            (run.id,),
        )
    await queue.complete(run.id, "go")
    await parked(store, run.id, "quarantine")
    page = await client.get(f"/runs/{run.id}")
    assert "waits: quarantine" in page.text
    r = await post(client, f"/runs/{run.id}/resume")  # no step named: accept the recorded
    assert r.status_code == 303 and r.headers["location"].endswith("?done=resumed")
    assert (await run.result(timeout=10))[0] == 5
    (resumed,) = [x.payload for x in await store.journal.records(run.id) if x.kind == "resumed"]
    assert mentions_dashboard(resumed)
