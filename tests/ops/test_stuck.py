"""``runfleet stuck``: only what the fleet will not fix by itself, each with what to do.

The rows are made by the store's own operations (a real claim and a real park under
an owner identity), never by editing rows: the stale lease is a real lease that
nobody renewed, vouched for by a liveness key this test keeps fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.ops.models import Explanation, StuckView
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.transient import REDIS_TYPES
from runfleet.store.types import Activated, NewRun, Owner, Parked, RunRow, Waiting, WaitingReason
from tests.ops.conftest import Cli
from tests.support.polling import until


async def _owned(store: Store, owner: Owner, flow: str = "tests.forever") -> RunRow:
    run_id = f"stuck-{uuid.uuid4().hex[:8]}"
    await store.admission.create(NewRun(id=run_id, flow=flow, payload={"args": []}))
    row = await store.runs.get(run_id)
    assert row is not None
    activated = await store.runs.claim_and_activate(run_id, row.snapshot, owner)
    assert isinstance(activated, Activated)
    return activated.row


@pytest.fixture
async def alive_owner(settings: Settings) -> AsyncIterator[Owner]:
    """An owner this very process stands for, its liveness key kept fresh meanwhile."""
    owner = Owner(settings.host_id, os.getpid(), uuid.uuid4().hex[:12])
    redis = connect(settings)
    live = Liveness(redis, settings.redis_prefix, settings.host_id)
    stop = asyncio.Event()
    # Its last confirmed renewal: the moment it claims the test's rows (right after this),
    # so the key stays consistent with their heartbeats and the probe vouches.
    confirmed = int(time.time() * 1000)

    async def refresh() -> None:
        while not stop.is_set():
            info: dict[str, str | int | bool] = {"queues": "default", "runs": 1}
            with contextlib.suppress(*REDIS_TYPES, OSError, TimeoutError):  # a loaded machine
                await live.refresh(owner, confirmed, False, ttl_s=1.0, info=info)
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.1)
            except TimeoutError:
                pass

    await live.refresh(owner, confirmed, False, ttl_s=1.0)
    task = asyncio.create_task(refresh())
    try:
        yield owner
    finally:
        stop.set()
        await task
        await live.clear(owner)
        await redis.aclose()


async def _stale(store: Store, settings: Settings, run_id: str) -> RunRow:
    async def check() -> RunRow | None:
        row = await store.runs.get(run_id)
        assert row is not None and row.heartbeat_at_ms is not None
        return row if row.now_ms - row.heartbeat_at_ms > settings.stale_after_ms else None

    return await until(check, settings.stale_after + 5, f"{run_id}'s lease to go stale")


async def test_stale_lease_of_a_live_owner_is_stuck_and_explained(
    store: Store, settings: Settings, alive_owner: Owner, cli: Cli
) -> None:
    row = await _owned(store, alive_owner)
    ghost = await _owned(store, Owner("ghost-host", 4_000_000, "0badc0ffee00"))
    await _stale(store, settings, row.id)
    await _stale(store, settings, ghost.id)

    raw = await cli("stuck", "--json")
    assert raw.code == 0 and raw.clean, raw
    view = StuckView.model_validate_json(raw.stdout)
    kinds = {item.run.id: item.kind for item in view.items}
    assert kinds.get(row.id) == "stale-owner-alive"
    # A dead owner's stale lease is the sweeps' job, not a person's (not overdue yet).
    assert ghost.id not in kinds
    (item,) = [i for i in view.items if i.run.id == row.id]
    assert f"pid {os.getpid()}" in item.detail and "takeovers are refused" in item.detail

    text = await cli("stuck")
    assert text.code == 0, text
    assert row.id in text.stdout and "stale-owner-alive" in text.stdout

    explained = Explanation.model_validate_json((await cli("explain", row.id, "--json")).stdout)
    assert explained.owner_probe is not None and explained.owner_probe.vouches
    assert explained.lease is not None and explained.lease.stale
    assert explained.next.needs_person
    assert "takeovers are refused" in explained.next.summary

    dead = Explanation.model_validate_json((await cli("explain", ghost.id, "--json")).stdout)
    assert (
        dead.owner_probe is not None and dead.owner_probe.evidence == "cross-host-unreachable-stale"
    )
    assert "will try a takeover within" in dead.next.summary


async def test_quarantine_unfired_timer_and_old_pending_are_listed(
    store: Store, settings: Settings, cli: Cli
) -> None:
    ghost = Owner("ghost-host", 4_000_001, "0badc0ffee01")
    quarantined = await _owned(store, ghost)
    parked = await store.waits.park(
        quarantined.id, ghost, quarantined.epoch, Waiting(reason=WaitingReason.QUARANTINE)
    )
    assert isinstance(parked, Parked)
    sleeper = await _owned(store, ghost)
    due = sleeper.now_ms - 60_000  # due a minute ago, and no worker runs to wake it
    timer = await store.waits.park(
        sleeper.id, ghost, sleeper.epoch, Waiting(reason=WaitingReason.TIMER, wake_at_ms=due)
    )
    assert isinstance(timer, Parked)
    pending = f"pending-{uuid.uuid4().hex[:8]}"
    await store.admission.create(NewRun(id=pending, flow="tests.sleepy", payload={"args": [1]}))

    raw = await cli("stuck", "--json", "--pending-for", "0s", "--overdue", "5s")
    assert raw.code == 0, raw
    kinds = {i.run.id: i.kind for i in StuckView.model_validate_json(raw.stdout).items}
    assert kinds == {
        quarantined.id: "quarantined",
        sleeper.id: "timer-not-fired",
        pending: "pending-too-long",
    }
    later = await cli("stuck", "--json", "--pending-for", "1h")
    assert pending not in {i.run.id for i in StuckView.model_validate_json(later.stdout).items}

    explained = Explanation.model_validate_json((await cli("explain", sleeper.id, "--json")).stdout)
    assert explained.next.needs_person
    assert explained.next.summary.startswith("due 1 min")
    q = Explanation.model_validate_json((await cli("explain", quarantined.id, "--json")).stdout)
    assert q.next.needs_person and "operator's resume" in q.next.summary
