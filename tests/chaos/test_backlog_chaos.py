"""A 50,000-run backlog survives a Redis FLUSHALL and a stream deletion mid-drain.

Both destroy wakes of runs that are merely queued (tens of thousands of them): the wake
marks see the stream's ids go back and count everything it held as lost, the lost-pending
sweep wakes them again, and every run completes exactly once — one activation, one
settlement, nothing failed, nothing stolen. The Redis broken here is this test's own
throwaway server; Postgres is the test's own database.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
import redis.asyncio as aioredis

from runfleet.broker.streams import Lane, Streams
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.chaos.conftest import chaos_settings
from tests.fleet.flows import sleepy
from tests.fleet.procs import WorkerProc

pytestmark = pytest.mark.chaos

RUNS = 50_000
ADMIT_BATCH = 1000
FLUSH_AT = RUNS // 5  # completed runs when Redis is flushed
DELETE_AT = 2 * RUNS // 5  # ... and when the normal lane's stream is deleted
TIMEOUT_S = 1200.0  # a loaded two-core box drains a few hundred runs a second


async def _counts(url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        rows = await (
            await conn.execute("SELECT status, count(*) FROM runfleet.runs GROUP BY status")
        ).fetchall()
    return {str(status): int(n) for status, n in rows}


async def _drained_to(url: str, completed: int, workers: list[WorkerProc]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    report = 0.0
    while True:
        counts = await _counts(url)
        if counts.get("completed", 0) >= completed:
            return
        if set(counts) - {"pending", "running", "completed"}:
            raise AssertionError(f"a run left the happy path: {counts}")
        for w in workers:
            if w.proc.poll() is not None:
                raise AssertionError(f"worker {w.pid} exited:\n{w.log()[-4000:]}")
        if time.monotonic() > report:
            print(f"backlog chaos: {counts}")
            report = time.monotonic() + 10
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- worker {w.pid}:\n{w.log()[-4000:]}" for w in workers)
            raise TimeoutError(f"{counts} after {TIMEOUT_S} s\n{logs}")
        await asyncio.sleep(0.5)


@pytest.mark.timeout(TIMEOUT_S + 300)
async def test_flushall_and_stream_deletion_mid_drain_lose_nothing(
    settings: Settings, own_redis: ThrowawayRedis, store: Store
) -> None:
    ours = chaos_settings(settings, redis_url=own_redis.url)
    url = ours.database_url
    async with AsyncQueue("default", settings=ours) as queue:
        for _ in range(RUNS // ADMIT_BATCH):
            await queue.enqueue_many([EnqueueSpec(sleepy, (0,))] * ADMIT_BATCH)
    client = aioredis.Redis.from_url(own_redis.url)
    streams = Streams(client, ours.redis_prefix)
    workers = [WorkerProc(ours, concurrency=16) for _ in range(2)]
    began = time.monotonic()
    try:
        for w in workers:
            await w.wait_started()
        await _drained_to(url, FLUSH_AT, workers)
        await client.flushall()
        print(f"backlog chaos: FLUSHALL at {await _counts(url)}")
        await _drained_to(url, DELETE_AT, workers)
        await client.delete(streams.stream_key("default", Lane.NORMAL))
        print(f"backlog chaos: stream deleted at {await _counts(url)}")
        await _drained_to(url, RUNS, workers)
    finally:
        for w in workers:
            w.close()
        await client.aclose()
    print(f"backlog chaos: {RUNS} runs in {time.monotonic() - began:.0f} s")

    assert await _counts(url) == {"completed": RUNS}
    assert await store.stats.settled_more_than_once() == {}
    async with await psycopg.AsyncConnection.connect(url) as conn:
        rows = await (
            await conn.execute(
                "SELECT kind, count(*), count(DISTINCT run_id) FROM runfleet.journal "
                "WHERE kind IN ('claimed-and-activated', 'stolen-and-activated', 'transitioned')"
                " GROUP BY kind"
            )
        ).fetchall()
    kinds = {str(kind): (int(n), int(runs)) for kind, n, runs in rows}
    # Each run activated once (so executed once: the no-op has no step to replay) and
    # settled once; no takeover, since no worker died.
    assert kinds.get("claimed-and-activated") == (RUNS, RUNS), kinds
    assert kinds.get("transitioned") == (RUNS, RUNS), kinds
    assert "stolen-and-activated" not in kinds, kinds
