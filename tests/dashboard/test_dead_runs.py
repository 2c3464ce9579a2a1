"""A poison run parked dead is on the overview (page and JSON) and its resume button works."""

from __future__ import annotations

from runfleet.ops.dashboard.models import OverviewView
from runfleet.store import Kind, Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.types import DeadLettered, RunStatus
from tests.dashboard.conftest import Dash, post
from tests.store.helpers import OWNER_A, OWNER_B, extra_stores, make_running, wait_db_time_past


async def test_a_dead_run_is_listed_and_resumed_from_the_dashboard(
    settings: Settings, store: Store, dashboard: Dash
) -> None:
    # With RUNFLEET_MAX_RECOVERIES=0, the first steal of a lost owner's run parks it dead.
    no_recovery = settings.model_copy(update={"max_recoveries": 0})
    async with extra_stores(no_recovery, 1) as (thief,):
        row = await make_running(thief, "poison", flow="tests.dashboard.poison")
        assert row.heartbeat_at_ms is not None
        await wait_db_time_past(store, row.heartbeat_at_ms)
        evidence = jr.ProbeEvidence(probe="same-host-pid-dead", observer=OWNER_B.key)
        buried = await thief.runs.steal("poison", row.snapshot, OWNER_B, evidence, stale_after_ms=0)
    assert isinstance(buried, DeadLettered), buried

    client = await dashboard()
    view = OverviewView.model_validate_json((await client.get("/api/overview")).text)
    assert [d.id for d in view.dead] == ["poison"]
    assert [s.entry.kind for s in view.steals if s.run_id == "poison"] == [Kind.DEAD_LETTERED]
    page = (await client.get("/")).text
    assert "Dead runs: need a person" in page and 'href="/runs/poison"' in page
    assert f"processes lost, newest first: {OWNER_A.host_id} pid {OWNER_A.pid}" in page
    run_page = (await client.get("/runs/poison")).text
    assert "needs a person: it is parked dead" in run_page

    resumed = await post(client, "/runs/poison/resume")
    assert resumed.status_code == 303, resumed.text
    moved = await store.runs.get("poison")
    assert moved is not None and moved.status is RunStatus.SUSPENDED and moved.waiting is None
    assert moved.recoveries == 0
    (record,) = [r for r in await store.journal.records("poison") if r.kind == Kind.RESUMED]
    assert record.payload["from"] == "dead" and "dashboard:" in str(record.payload["note"])
    view = OverviewView.model_validate_json((await client.get("/api/overview")).text)
    assert view.dead == []
