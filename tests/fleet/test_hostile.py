"""Redis write access can delay runs, never decide or kill them.

Real worker processes, real Postgres and Redis. A 200,000-deep JSON array on the
cancel and settled channels once made every worker exit (RecursionError) and
broke producers' ``result()``; a forged liveness key (no TTL, confirmed in 1970)
once blocked a takeover forever. Here the fleet survives the first and the
second is "unknown", so the stale lease decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator

import msgpack
import pytest
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.producer import AsyncQueue, RunCancelled
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.transient import REDIS_TYPES
from runfleet.store.types import Activated, NewRun, Owner, RunRow, RunStatus
from tests.fleet.procs import Spawn, records
from tests.support.polling import until

pytestmark = pytest.mark.chaos

DEEP_JSON = b"[" * 200_000 + b"]" * 200_000
GARBAGE = [DEEP_JSON, b"[" * 3000 + b"]" * 3000, b"\xff\xfe\x00", b'{"run": 7}', b"x" * 500_000]


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def _flood(redis: Redis, settings: Settings, stop: asyncio.Event) -> int:
    """Publish garbage on both channels until ``stop``; returns how many were sent."""
    sent = 0
    while not stop.is_set():
        for channel in ("cancel", "settled"):
            for payload in GARBAGE:
                await redis.publish(f"{settings.redis_prefix}:{channel}", payload)
                sent += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    return sent


async def test_deep_json_on_cancel_and_settled_channels_does_not_kill_workers(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings, redis: Redis
) -> None:
    workers = [spawn(), spawn()]
    for w in workers:
        await w.wait_started()
    stop = asyncio.Event()
    flood = asyncio.create_task(_flood(redis, settings, stop))
    try:
        runs = [await queue.enqueue(flows.sleepy, 200, f"h{i}") for i in range(8)]
        # result() waits on the settled channel while it is full of garbage.
        results = [await run.result(timeout=20) for run in runs]
        assert [r["tag"] for r in results] == [f"h{i}" for i in range(8)]
        # The cancel listener is still there: a cancel reaches a running run at once.
        victim = await queue.enqueue(flows.forever)

        async def running() -> RunRow | None:
            row = await store.runs.get(victim.id)
            return row if row is not None and row.status is RunStatus.RUNNING else None

        await until(running, 10, "the forever run to start")
        await victim.cancel()
        with pytest.raises(RunCancelled):
            await victim.result(timeout=10)
    finally:
        stop.set()
        sent = await flood
    assert sent >= 2 * len(GARBAGE)
    for w in workers:
        assert w.proc.poll() is None, w.log()[-3000:]
        assert "notify.malformed" in w.log()
        assert "RecursionError" not in w.log()


async def _ghost_run(store: Store, owner: Owner) -> RunRow:
    """A running row owned by ``owner`` (a real claim under an identity no worker has)."""
    run_id = f"ghost-{uuid.uuid4().hex[:8]}"
    await store.admission.create(
        NewRun(id=run_id, flow="tests.sleepy", payload={"args": [50, "taken"]})
    )
    row = await store.runs.get(run_id)
    assert row is not None
    activated = await store.runs.claim_and_activate(run_id, row.snapshot, owner)
    assert isinstance(activated, Activated)
    return activated.row


async def _completed_by_steal(store: Store, run_id: str, timeout: float) -> dict[str, object]:
    async def done() -> RunRow | None:
        row = await store.runs.get(run_id)
        return row if row is not None and row.status is RunStatus.COMPLETED else None

    await until(done, timeout, f"{run_id} to be taken over and completed")
    (steal,) = await records(store, run_id, Kind.STOLEN_AND_ACTIVATED)
    return dict(steal.payload)


async def test_forged_liveness_key_does_not_block_a_takeover(
    spawn: Spawn, store: Store, settings: Settings, redis: Redis
) -> None:
    """No TTL, confirmed in 1970: on another host, and on this host with a running pid."""
    cross = Owner("ghost-host", 4_000_000, uuid.uuid4().hex[:12])
    same = Owner(settings.host_id, os.getpid(), uuid.uuid4().hex[:12])  # this test's pid is alive
    rows = [await _ghost_run(store, o) for o in (cross, same)]
    forged = msgpack.packb({"confirmed_ms": 0, "lapsed": False, "started_ms": 0})
    for owner in (cross, same):
        await redis.set(f"{settings.redis_prefix}:alive:{owner.key}", forged)  # no TTL
    worker = spawn()
    await worker.wait_started()
    budget = settings.stale_after + 10 * settings.sweep_interval + 5
    for row in rows:
        steal = await _completed_by_steal(store, row.id, budget)
        assert steal["probe"] == "lease-expired", steal
        assert steal["probe_detail"]["key"] == "without-ttl", steal  # type: ignore[index]  # the steal record's probe_detail is a dict
    refused = [
        r for row in rows for r in await records(store, row.id, Kind.STEAL_REFUSED_OWNER_ALIVE)
    ]
    assert refused == []


async def test_consistent_key_of_a_live_owner_is_refused_until_it_lapses_into_inconsistency(
    spawn: Spawn, store: Store, settings: Settings, redis: Redis
) -> None:
    """Control: the key a live owner writes does vouch; the same owner renewing other runs
    (its confirmed time moving past this run's heartbeat) no longer vouches for this one."""
    owner = Owner("ghost-host", 4_000_001, uuid.uuid4().hex[:12])
    row = await _ghost_run(store, owner)
    assert row.heartbeat_at_ms is not None
    live = Liveness.for_settings(redis, settings)
    confirmed = row.heartbeat_at_ms
    stop = asyncio.Event()

    async def keep_fresh() -> None:
        while not stop.is_set():
            # The stand-in owner renews as a worker does: a slow or failed write (a loaded
            # machine) is retried at the next interval, not the end of the owner.
            with contextlib.suppress(*REDIS_TYPES, OSError, TimeoutError):
                await live.refresh(owner, confirmed, False, timeout=settings.heartbeat_interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.heartbeat_interval)

    refresher = asyncio.create_task(keep_fresh())
    worker = spawn()
    try:
        await worker.wait_started()

        async def refused() -> bool:
            return bool(await records(store, row.id, Kind.STEAL_REFUSED_OWNER_ALIVE))

        await until(refused, settings.stale_after + 10, "the takeover to be refused")
        (first, *_) = await records(store, row.id, Kind.STEAL_REFUSED_OWNER_ALIVE)
        assert first.payload["probe"] == "cross-host-key-fresh"
        current = await store.runs.get(row.id)
        assert current is not None and current.owner == owner
        # The owner now confirms renewals that leave this run out.
        confirmed = int(time.time() * 1000) + 10 * settings.heartbeat_interval_ms
        steal = await _completed_by_steal(store, row.id, 3 * settings.stale_after + 10)
        assert steal["probe"] == "lease-expired", steal
        assert steal["probe_detail"]["key"] == "inconsistent", steal  # type: ignore[index]  # the steal record's probe_detail is a dict
    finally:
        stop.set()
        await refresher


async def test_wrongtype_stream_key_does_not_kill_workers(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings, redis: Redis
) -> None:
    """The queue's stream key replaced by a string: every stream call gets WRONGTYPE."""
    worker = spawn()
    await worker.wait_started()
    stream = f"{settings.redis_prefix}:q:default"
    await redis.delete(stream)
    await redis.set(stream, b"not a stream")
    try:
        run = await queue.enqueue(flows.sleepy, 10, "wrongtype")
        # No stream hint can reach the worker: the sweeps and Postgres carry the run.
        result = await run.result(timeout=30)
        assert result["tag"] == "wrongtype"
        assert worker.proc.poll() is None, worker.log()[-3000:]
    finally:
        await redis.delete(stream)
