"""The run page shows only the buttons that fit the run's state, and retries a failed run."""

from __future__ import annotations

import re

import pytest

import tests.dashboard.flows as d
import tests.fleet.flows as fleet_flows
import tests.flows.flows as f
from runfleet.producer import AsyncQueue, RunFailed
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.dashboard.conftest import Dash, mentions_dashboard, post
from tests.flows.conftest import parked
from tests.support.polling import until

BUTTONS = ("cancel", "approve", "deny", "resume", "retry")


def buttons(page: str) -> set[str]:
    return {b for b in BUTTONS if re.search(rf'<button[^>]* id="{b}"', page)}


async def _settled(store: Store, run_id: str, status: RunStatus) -> None:
    async def check() -> bool:
        row = await store.runs.get(run_id)
        return row is not None and row.status is status

    await until(check, 10, f"run {run_id} to be {status.value}")


async def test_each_state_shows_the_actions_that_fit(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    busy = await queue.enqueue(d.busy, 30)
    await _settled(store, busy.id, RunStatus.RUNNING)
    assert buttons((await client.get(f"/runs/{busy.id}")).text) == {"cancel"}

    asking = await queue.enqueue(f.approver, 5)
    await parked(store, asking.id, "approval")
    assert buttons((await client.get(f"/runs/{asking.id}")).text) == {"cancel", "approve", "deny"}

    done = await queue.enqueue(d.ticker, 1, 0)
    assert await done.result(timeout=10) == 0
    page = (await client.get(f"/runs/{done.id}")).text
    assert buttons(page) == set() and "no action fits a completed run" in page

    await post(client, f"/runs/{busy.id}/cancel")
    await _settled(store, busy.id, RunStatus.CANCELLED)
    page = (await client.get(f"/runs/{busy.id}")).text
    assert buttons(page) == set() and "no action fits a cancelled run" in page


async def test_retry_a_failed_run(
    worker: Worker, queue: AsyncQueue, store: Store, dashboard: Dash
) -> None:
    client = await dashboard()
    failing = await queue.enqueue(fleet_flows.boom, "bad input")
    with pytest.raises(RunFailed):
        await failing.result(timeout=10)
    assert buttons((await client.get(f"/runs/{failing.id}")).text) == {"retry"}

    r = await post(client, f"/runs/{failing.id}/retry")
    assert r.status_code == 303, r.text
    assert r.headers["location"] == f"/runs/{failing.id}@1?done=retried"
    again = await store.runs.get(f"{failing.id}@1")
    assert again is not None and again.state.get("requeued_from") == failing.id
    assert mentions_dashboard(again.state.get("requeued_by"))
    with pytest.raises(RunFailed):  # the same flow and arguments ran again
        await failing.result(timeout=10)
    old = (await client.get(f"/runs/{failing.id}")).text
    assert "retry" not in buttons(old) and "requeued as" in old  # retried once, from here
    assert buttons((await client.get(f"/runs/{failing.id}@1")).text) == {"retry"}
    api = await client.post(
        f"/runs/{failing.id}@1/retry",
        data={"csrf": re.findall(r'name="csrf" value="([^"]+)"', old)[0]},
        headers={"origin": "http://testserver", "accept": "application/json"},
    )
    assert api.status_code == 200 and api.json()["run_id"] == f"{failing.id}@2", api.text
