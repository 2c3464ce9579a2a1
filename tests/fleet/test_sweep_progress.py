"""Nothing stays parked once runnable: sweeps read past rows nobody can take (real processes).

Blockers are runs of flows the surviving worker no longer has (a retired deployment),
placed in front of one takeable run in each sweep's order. With a batch smaller than
the blockers, a sweep that re-read the same oldest batch every tick would never reach
the takeable run; the cursor reaches it within ceil(rows / batch) ticks.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from functools import partial

import pytest

import tests.fleet.recovery_flows as rec
import tests.fleet.retired_flows as retired
from runfleet.broker.client import connect
from runfleet.broker.streams import Lane, Streams
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunRow, RunStatus
from tests.fleet.procs import Spawn, records
from tests.support.polling import until

pytestmark = pytest.mark.chaos

BLOCKERS = 20
BATCH = 8
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


async def _status(store: Store, ids: list[str], status: RunStatus, parked: bool | None) -> bool:
    rows = await store.runs.get_many(ids)
    return len(rows) == len(ids) and all(
        r.status is status and (parked is None or (r.waiting is not None) == parked) for r in rows
    )


async def _lost_wake_complete(settings: Settings, run_ids: list[str]) -> None:
    """Answer the waits while the producer cannot reach Redis: the wakes are lost."""
    async with AsyncQueue("default", settings=settings, redis_url=UNREACHABLE_REDIS) as blind:
        for run_id in run_ids:
            assert await blind.complete(run_id, "go", {"answered": run_id})


async def test_woken_run_with_lost_wake_resumes_without_pending_backlog(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    w = spawn(flows="tests.fleet.recovery_flows")
    await w.wait_started()
    run = await queue.enqueue(rec.waiter, run_id="waiting-one")
    await until(lambda: _status(store, [run.id], RunStatus.SUSPENDED, True), 10, "the park")

    answered = time.monotonic()
    await _lost_wake_complete(settings, [run.id])
    # An otherwise idle fleet: no pending run exists that could ever age into a sweep.
    assert (await store.stats.status_counts()).get(RunStatus.PENDING, 0) == 0
    assert await run.result(timeout=10) == {"answered": run.id}
    waited = time.monotonic() - answered
    # The runnable-suspended sweep waits 2 intervals for the answer's own wake, then a tick.
    assert waited < 2 * settings.sweep_interval + 6 * settings.sweep_interval + 2.0, waited


async def test_sweeps_progress_past_untakeable_rows(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    """Stale-running, parked-released, runnable-suspended and due-wait sweeps each reach a
    takeable run behind more blockers than one batch holds."""
    blockers = [f"aa-{i:02d}" for i in range(BLOCKERS)]
    # Worker X holds the stale blockers, the waiting blockers and their two targets.
    x = spawn(flows="tests.fleet.retired_flows", queues="qx", concurrency=64)
    # Worker W holds the released blockers; worker V, stopped after W, the released target.
    w = spawn(flows="tests.fleet.retired_flows", queues="qw", concurrency=32, grace_period=0.1)
    v = spawn(flows="tests.fleet.retired_flows", queues="qv", concurrency=4, grace_period=0.1)
    for proc in (x, w, v):
        await proc.wait_started()

    async with (
        AsyncQueue("qx", settings=settings) as qx,
        AsyncQueue("qw", settings=settings) as qw,
        AsyncQueue("qv", settings=settings) as qv,
    ):
        stale = [f"stale-{b}" for b in blockers]
        waits = [f"wait-{b}" for b in blockers]
        released = [f"rel-{b}" for b in blockers]
        for run_id in stale:
            await qx.enqueue(retired.retired_forever, run_id=run_id)
        for run_id in waits:
            await qx.enqueue(retired.retired_waiter, run_id=run_id)
        for run_id in released:
            await qw.enqueue(retired.retired_forever, run_id=run_id)
        # Same owner, same heartbeat: the run id orders the target after its blockers.
        await qx.enqueue(rec.nap, 600_000, run_id="stale-zz-target")
        await qx.enqueue(rec.waiter, run_id="wait-zz-target")
        await qv.enqueue(rec.nap, 600_000, run_id="rel-zz-target")
        await until(
            lambda: _status(store, [*stale, "stale-zz-target"], RunStatus.RUNNING, None),
            20,
            "X to run the stale blockers and target",
        )
        await until(
            lambda: _status(store, [*waits, "wait-zz-target"], RunStatus.SUSPENDED, True),
            20,
            "X to park the waiting blockers and target",
        )
        await until(
            lambda: _status(store, [*released, "rel-zz-target"], RunStatus.RUNNING, None),
            20,
            "W and V to run the released blockers and target",
        )

        x.signal(signal.SIGKILL)
        assert await x.wait_exit() == -signal.SIGKILL
        # Answered with the wake lost, blockers first: later updated_at, after them.
        await _lost_wake_complete(settings, [*waits, "wait-zz-target"])
        w.signal(signal.SIGTERM)
        assert await w.wait_exit() == 0
        v.signal(signal.SIGTERM)
        assert await v.wait_exit() == 0
        assert await _status(store, [*released, "rel-zz-target"], RunStatus.SUSPENDED, True)

        # Due waits: delayed admissions of the retired flow fall due before the target's.
        delayed = [f"delay-{b}" for b in blockers]
        for run_id in delayed:
            await qx.enqueue_in(timedelta(milliseconds=300), retired.retired_forever, run_id=run_id)
        await qx.enqueue_in(timedelta(milliseconds=600), rec.nap, 1, run_id="delay-zz-target")

    # Every direct wake the stopped workers sent is lost (a Redis restart would do this).
    redis = connect(settings)
    try:
        streams = Streams(redis, settings.redis_prefix)
        await redis.delete(
            *[streams.stream_key(q, lane) for q in ("qx", "qw", "qv") for lane in Lane]
        )
    finally:
        await redis.aclose()

    z = spawn(
        flows="tests.fleet.recovery_flows", queues="qx,qw,qv", concurrency=8, sweep_batch=BATCH
    )
    await z.wait_started()

    async def taken(run_id: str) -> RunRow | None:
        row = await store.runs.get(run_id)
        if row is None or row.owner is None or row.owner.pid != z.pid:
            return row if row is not None and row.status is RunStatus.COMPLETED else None
        return row

    # ceil(21 / 8) = 3 ticks per cycle, plus stale_after for the leases: well under 15 s.
    budget = settings.stale_after + 10 * settings.sweep_interval + 8
    for target in ("stale-zz-target", "rel-zz-target", "wait-zz-target", "delay-zz-target"):
        await until(partial(taken, target), budget, f"Z to take {target} past the blockers")
    (steal,) = await records(store, "stale-zz-target", "stolen-and-activated")
    assert f":{z.pid}:" in steal.source_id

    # The blockers are still there, untaken: they really were in front all along.
    assert await _status(store, stale, RunStatus.RUNNING, None)
    assert await _status(store, released, RunStatus.SUSPENDED, True)
    assert await _status(store, waits, RunStatus.SUSPENDED, False)
    assert await _status(store, delayed, RunStatus.PENDING, True)
