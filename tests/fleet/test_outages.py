"""Losing Redis or restarting Postgres under a working fleet loses no run and settles none twice.

Every test here owns the server it breaks (a throwaway on its own port), so the
session's shared servers are never flushed or stopped. Redis only carries hints:
a FLUSHALL or a 10 s outage delays runs by about a sweep cycle. Postgres is the
truth: a restart makes workers lapse and release, and they ride it out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.producer import AsyncQueue, AsyncRun
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.types import RunRow, RunStatus
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

pytestmark = pytest.mark.chaos


@pytest.fixture
def own_redis() -> Iterator[ThrowawayRedis]:
    with ThrowawayRedis() as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres(durable_commits=True) as server:
        yield server


@asynccontextmanager
async def fleet(settings: Settings, size: int) -> AsyncIterator[list[WorkerProc]]:
    procs = [WorkerProc(settings) for _ in range(size)]
    try:
        for proc in procs:
            await proc.wait_started()
        yield procs
    finally:
        for proc in procs:
            proc.close()


async def enqueue_sleepy(queue: AsyncQueue, count: int, tag: str) -> list[AsyncRun]:
    rng = random.Random(tag)
    return [
        await queue.enqueue(flows.sleepy, rng.randint(200, 600), f"{tag}-{i}") for i in range(count)
    ]


async def running_at_least(store: Store, runs: list[AsyncRun], n: int) -> bool:
    rows = await store.runs.get_many([r.id for r in runs])
    return sum(row.status is RunStatus.RUNNING for row in rows) >= n


async def not_started(store: Store, runs: list[AsyncRun]) -> int:
    rows = await store.runs.get_many([r.id for r in runs])
    return sum(row.status is RunStatus.PENDING for row in rows)


async def all_settled(store: Store, runs: list[AsyncRun], timeout: float) -> list[RunRow]:
    """Wait (polling Postgres, which works whatever Redis does) until every run is terminal."""

    async def check() -> list[RunRow] | None:
        try:
            rows = await store.runs.get_many([r.id for r in runs])
        except Exception:  # the database may be restarting: ask again
            return None
        done = len(rows) == len(runs) and all(row.status.terminal for row in rows)
        return rows if done else None

    return await until(check, timeout, f"{len(runs)} runs to settle")


async def assert_each_completed_once(store: Store, runs: list[AsyncRun]) -> None:
    rows = {row.id: row for row in await all_settled(store, runs, timeout=1)}
    for run in runs:
        row = rows[run.id]
        assert row.status is RunStatus.COMPLETED, (run.id, row.status, row.state.get("error"))
        tag = row.result["tag"]
        assert isinstance(tag, str) and row.result["slept"] == row.payload["args"][0]
        assert row.payload["args"][1] == tag
        settlements = [
            r for r in await store.journal.records(run.id) if r.kind == Kind.TRANSITIONED
        ]
        assert len(settlements) == 1, (run.id, settlements)


async def test_redis_flushall_mid_run(
    own_redis: ThrowawayRedis, settings: Settings, store: Store
) -> None:
    settings = settings.model_copy(update={"redis_url": own_redis.url})
    async with fleet(settings, 2) as workers, AsyncQueue("default", settings=settings) as queue:
        runs = await enqueue_sleepy(queue, 20, "flush")
        await until(lambda: running_at_least(store, runs, 3), 10, "a few runs to start")
        admin: Redis = connect(settings)
        try:
            assert await admin.flushall()
        finally:
            await admin.aclose()
        # Their schedule messages are gone with the streams: only the sweeps can save them.
        assert await not_started(store, runs) > 0
        await all_settled(store, runs, timeout=20)
        await assert_each_completed_once(store, runs)
        assert all(w.proc.poll() is None for w in workers)


async def test_redis_down_for_ten_seconds(
    own_redis: ThrowawayRedis, settings: Settings, store: Store
) -> None:
    settings = settings.model_copy(update={"redis_url": own_redis.url})
    async with fleet(settings, 2) as workers, AsyncQueue("default", settings=settings) as queue:
        runs = await enqueue_sleepy(queue, 20, "down")
        await until(lambda: running_at_least(store, runs, 2), 10, "some runs to start")
        await asyncio.to_thread(own_redis.kill)
        down_at = time.monotonic()
        assert await not_started(store, runs) > 0
        # Admission commits in Postgres first; the lost publish is only logged.
        during = await asyncio.wait_for(enqueue_sleepy(queue, 5, "during"), timeout=8)
        for run in during:
            assert await run.get_status() in (RunStatus.PENDING, RunStatus.RUNNING,
                                              RunStatus.COMPLETED)  # fmt: skip
        await asyncio.sleep(max(0.0, 10 - (time.monotonic() - down_at)))  # the outage itself
        await asyncio.to_thread(own_redis.restart)
        await all_settled(store, runs + during, timeout=20)
        await assert_each_completed_once(store, runs + during)
        assert all(w.proc.poll() is None for w in workers)


async def test_postgres_restart_mid_run(
    own_postgres: ThrowawayPostgres, settings: Settings
) -> None:
    await migrate(own_postgres.url)
    settings = settings.model_copy(update={"database_url": own_postgres.url})
    store = await Store.open(settings)
    try:
        async with fleet(settings, 2) as workers, AsyncQueue("default", settings=settings) as queue:
            runs = await enqueue_sleepy(queue, 20, "pg")
            await until(lambda: running_at_least(store, runs, 4), 10, "runs in flight")
            await asyncio.to_thread(own_postgres.restart)
            await all_settled(store, runs, timeout=25)
            await assert_each_completed_once(store, runs)
            for worker in workers:
                assert worker.proc.poll() is None, worker.log()[-3000:]
    finally:
        await store.close()
