"""The row decides which pool executes a run, whatever a Redis message names.

A run's queue is chosen at admission and kept in Postgres; which worker pool (hardware,
zone, credentials) executes it follows from that row alone. A well-formed ``schedule``
message for a run of queue ``gpu``, added by a raw Redis client to another queue's
stream, is dropped by that queue's workers, never claimed and completed there, and the
run waits for a worker of its own queue; and no claim statement (single delivery, batch,
drive from the row, two-step claim, steal) takes a run of a queue its store does not serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.codec import FIELD, encode, message_for
from runfleet.broker.keys import GROUP
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.journal_records import WakeCause
from runfleet.store.roles import GroupRole
from runfleet.store.types import (
    Activated,
    CancelRequested,
    Claimed,
    NotServed,
    Owner,
    Parked,
    RunRow,
    RunStatus,
    Stolen,
    Waiting,
    WaitingReason,
)
from tests.fleet.procs import Spawn
from tests.security.conftest import MakeLogin
from tests.support.polling import until

FLOWS = "tests.security.flows"


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def _drained(redis: Redis, stream: str) -> bool:
    """Every entry of ``stream`` was delivered to a worker and acknowledged (decided)."""
    if not await redis.exists(stream):
        return False
    for group in await redis.xinfo_groups(stream):
        if group["name"] in (GROUP, GROUP.encode()):
            return int(group["lag"] or 0) == 0 and int(group["pending"]) == 0
    return False


async def test_a_schedule_message_on_another_queues_stream_moves_nothing(
    login: MakeLogin, spawn: Spawn, settings: Settings, redis: Redis, store: Store
) -> None:
    fleet = await login(GroupRole.WORKER)
    producer = await login(GroupRole.PRODUCER, "s1")
    other = spawn(flows=FLOWS, queues="cpu", database_url=fleet.url)
    await other.wait_started()
    async with AsyncQueue("gpu", settings=producer.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.leaf", 21, run_id="for-the-gpu-pool")

    # A raw Redis client forges well-formed messages naming the run, on both lanes of the
    # cpu queue's streams, and moves the run's own message away (gpu's stream emptied).
    forged = encode(message_for(run.id, "sec.leaf", WakeReason.ENQUEUE, "schedule"))
    prefix = settings.redis_prefix
    for stream in (f"{prefix}:q:cpu", f"{prefix}:recovery:cpu"):
        for _ in range(3):
            await redis.xadd(stream, {FIELD: forged})
    # The cpu worker's one wake on gpu's stream (``Decider._not_served``) is written
    # before the trim: the trim destroys it too, and gpu's idle stream, emptied, gets no
    # entry that would move its group past the lost ones (the lost-wake sweep must see that
    # the stream no longer holds them, not wait for a delivery that never comes).
    await asyncio.sleep(0.5)
    await redis.xtrim(f"{prefix}:q:gpu", maxlen=0)

    for stream in (f"{prefix}:q:cpu", f"{prefix}:recovery:cpu"):
        await until(partial(_drained, redis, stream), 20, f"the cpu worker to decide {stream}")
    await until(
        lambda: _true("run.not_served" in other.log()), 10, "the cpu worker to log the drop"
    )
    # Its sweeps run too (lost-wake, every 0.2 s here): give them a few ticks to misbehave.
    await asyncio.sleep(5 * settings.sweep_interval)
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.PENDING and row.owner is None, row
    assert row.epoch == 0 and row.claim is None, row
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert kinds == [Kind.CREATED], kinds

    # A worker of the run's own queue takes it: the cpu worker's wake on gpu's stream (or
    # the lost-wake sweep) brings it there even though its own message was deleted.
    gpu = spawn(flows=FLOWS, queues="gpu", database_url=fleet.url)
    await gpu.wait_started()
    async with AsyncQueue("gpu", settings=producer.settings, scopes=["s1"]) as q:
        assert await q.run(run.id).result(timeout=30) == 42
    (claimed,) = [
        r for r in await store.journal.records(run.id) if r.kind == Kind.CLAIMED_AND_ACTIVATED
    ]
    assert claimed.payload["owner"].split(":")[1] == str(gpu.pid), claimed
    for proc in (other, gpu):
        assert "Traceback" not in proc.log(), proc.log()[-3000:]


async def _true(value: bool) -> bool:
    return value


async def _settled_row(store: Store, run_id: str) -> RunRow:
    row = await store.runs.get(run_id)
    assert row is not None
    return row


async def test_no_claim_statement_takes_a_run_of_a_queue_it_does_not_serve(
    login: MakeLogin, settings: Settings, store: Store
) -> None:
    """The SQL says it, not only the driver: a store serving ``cpu`` claims no ``gpu`` run
    by any statement, whatever snapshot it hands in; serving ``gpu`` it does."""
    fleet = await login(GroupRole.WORKER)
    producer = await login(GroupRole.PRODUCER, "s1")
    me = Owner("cpu-host", 4_000_001, "c0ffee000001")
    cpu = await Store.open(fleet.settings, serves=["cpu"])
    gpu = await Store.open(fleet.settings, serves=["gpu"])
    try:
        async with AsyncQueue(
            "gpu", settings=producer.settings, scopes=["s1"], late_binding=True
        ) as q:
            ids = [(await q.enqueue("sec.leaf", i, run_id=f"gpu-{i}")).id for i in range(4)]
        rows = [await _settled_row(store, run_id) for run_id in ids]

        fresh_claim = await cpu.runs.claim_if_fresh(ids[0], "sec.leaf", me)

        fresh, seen = fresh_claim.outcome, fresh_claim.seen
        assert fresh is None and seen is not None and seen.status is RunStatus.PENDING
        assert isinstance(
            await cpu.runs.claim_and_activate(ids[0], rows[0].snapshot, me), NotServed
        )
        many = await cpu.runs.claim_and_activate_many(rows[1:3], me)
        assert all(isinstance(outcome, NotServed) for outcome in many.values()), many
        assert isinstance(await cpu.runs.claim(ids[3], rows[3].snapshot, me), NotServed)
        for run_id in ids:  # nothing moved, nothing journaled but the admission
            row = await _settled_row(store, run_id)
            assert row.status is RunStatus.PENDING and row.owner is None and row.claim is None
            assert [r.kind for r in await store.journal.records(run_id)] == [Kind.CREATED]

        # A steal: a running gpu run whose owner stopped renewing (a ghost) stays the
        # gpu pool's to take over.
        ghost = Owner("ghost-host", 4_000_002, "0badc0ffee02")
        activated = await gpu.runs.claim_and_activate(ids[0], rows[0].snapshot, ghost)
        assert isinstance(activated, Activated)

        async def stale() -> RunRow | None:
            row = await _settled_row(store, ids[0])
            assert row.heartbeat_at_ms is not None
            return row if row.now_ms - row.heartbeat_at_ms > settings.stale_after_ms else None

        running = await until(stale, 10, "the ghost's lease to turn stale")
        evidence = jr.ProbeEvidence(probe="lease-expired")
        assert isinstance(await cpu.runs.steal(ids[0], running.snapshot, me, evidence), NotServed)
        assert isinstance(await gpu.runs.steal(ids[0], running.snapshot, me, evidence), Stolen)
        assert isinstance(await gpu.runs.claim(ids[3], rows[3].snapshot, me), Claimed)

        # A cancelled pending run is closed by any worker (it never ran: nothing to
        # compensate); a parked one with a cancel waits for its own queue's workers.
        assert isinstance(await store.lifecycle.request_cancel(ids[1]), CancelRequested)
        pending = await _settled_row(store, ids[1])
        closing = await cpu.runs.claim_and_activate(ids[1], pending.snapshot, me)
        assert isinstance(closing, Activated), closing
        parked_row = await gpu.runs.claim_and_activate(ids[2], rows[2].snapshot, ghost)
        assert isinstance(parked_row, Activated)
        parked = await gpu.waits.park(
            ids[2], ghost, parked_row.row.epoch, Waiting(reason=WaitingReason.EVENT)
        )
        assert isinstance(parked, Parked)
        assert isinstance(await store.lifecycle.request_cancel(ids[2]), CancelRequested)
        await store.waits.wake(ids[2], cause=WakeCause.WAKE)
        suspended = await _settled_row(store, ids[2])
        assert suspended.status is RunStatus.SUSPENDED and suspended.waiting is None
        refused = await cpu.runs.claim_and_activate(ids[2], suspended.snapshot, me)
        assert isinstance(refused, NotServed), refused
        assert isinstance(
            await gpu.runs.claim_and_activate(ids[2], suspended.snapshot, me), Activated
        )
    finally:
        await cpu.close()
        await gpu.close()
