"""After a real SIGKILL and takeover the dashboard shows the steal, its evidence and the plot."""

from __future__ import annotations

import signal

import pytest

import tests.fleet.flows as flows
from runfleet.ops.dashboard.models import OverviewView
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.dashboard.conftest import Dash
from tests.fleet.procs import Spawn, running_on
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def test_a_takeover_is_shown_with_its_evidence(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings, dashboard: Dash
) -> None:
    client = await dashboard()
    a = spawn()
    await a.wait_started()
    run = await queue.enqueue(flows.sleepy, 8000, "dashboard")  # outlasts B's start
    await until(lambda: running_on(store, run.id, a.pid), 10, "run to start on A")
    b = spawn()
    await b.wait_started()
    a.signal(signal.SIGKILL)
    await until(lambda: running_on(store, run.id, b.pid), 15, "B to steal the run")

    view = OverviewView.model_validate_json((await client.get("/api/overview")).text)
    (steal,) = [s for s in view.steals if s.run_id == run.id]
    host = settings.host_id
    assert f"stolen from {host} pid {a.pid} by {host} pid {b.pid}" in steal.entry.sentence
    assert "[same-host-pid-dead]" in steal.entry.sentence
    recovery = view.charts[1]
    taken = next(s for s in recovery.series if s.name == "taken over")
    assert sum(taken.values) == 1
    page = await client.get("/")
    assert f'href="/runs/{run.id}"' in page.text and "same-host-pid-dead" in page.text
    assert "taken over 1" in page.text  # the recovery plot's legend

    run_page = await client.get(f"/runs/{run.id}")
    assert 'data-kind="stolen-and-activated"' in run_page.text
    assert f"took the run over from {host} pid {a.pid}" in run_page.text

    async def b_listed() -> bool:
        fleet = (await client.get("/fleet")).text
        return f'data-pid="{b.pid}"' in fleet

    assert await until(b_listed, 10, "B on the fleet page")
    await queue.cancel(run.id)
