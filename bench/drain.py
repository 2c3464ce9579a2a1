"""One drain, measured one way, for every row the fleet benchmark added after the headline.

A drain admits a standing backlog of no-op runs, spawns worker processes and waits until
every run settled; its window runs from the first activation record to the last
settlement record (database time). Progress and window are read from the journal after
the seq it had before the backlog was admitted — by its primary key, so a table holding
a million settled runs (the history case) costs the poll nothing: a count over
``runfleet.runs`` would read the whole history every 20 ms and slow the drain it watches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import psycopg
from psycopg.rows import dict_row

from bench.noop import QUEUE, noop_flow
from bench.rq_side import Drain
from runfleet.ops.bench.procs import Proc, runfleet_worker
from runfleet.ops.bench.scratch import BenchError
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.queries import q

FLOWS_MODULE = "bench.noop"
ADMIT_BATCH = 1000


async def journal_tail(conn: psycopg.AsyncConnection[dict[str, object]]) -> int:
    row = await (await conn.execute(q("bench.journal_tail"))).fetchone()
    assert row is not None
    return int(str(row["seq"]))


async def admit(settings: Settings, runs: int) -> None:
    """``runs`` no-op runs, ``enqueue_many`` in batches of 1,000."""
    async with AsyncQueue(QUEUE, settings=settings) as queue:
        for start in range(0, runs, ADMIT_BATCH):
            await queue.enqueue_many([EnqueueSpec(noop_flow)] * min(ADMIT_BATCH, runs - start))


async def wait_settled(
    conn: psycopg.AsyncConnection[dict[str, object]],
    after_seq: int,
    runs: int,
    procs: Sequence[Proc],
    timeout: float,
) -> None:
    """Until ``runs`` runs completed after ``after_seq``; a failure or a dead worker fails."""
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute(q("bench.drain_progress"), {"after_seq": after_seq})
        row = await cur.fetchone()
        assert row is not None
        done, bad = int(str(row["completed"])), int(str(row["bad"]))
        if bad:
            raise BenchError(f"{bad} runs failed or were cancelled during a drain")
        if done >= runs:
            return
        for proc in procs:
            if proc.proc.poll() is not None:
                raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"drain: {done}/{runs} settled in {timeout:.0f} s")
        await asyncio.sleep(0.02)


async def window_s(conn: psycopg.AsyncConnection[dict[str, object]], after_seq: int) -> float:
    cur = await conn.execute(q("bench.drain_window"), {"after_seq": after_seq})
    row = await cur.fetchone()
    if row is None or row["first_ms"] is None or row["last_ms"] is None:
        raise BenchError("the journal has no activation or settlement records for the drain")
    return (int(str(row["last_ms"])) - int(str(row["first_ms"]))) / 1000


async def runfleet_drain(
    settings: Settings, *, runs: int, workers: int, concurrency: int, timeout: float = 600
) -> Drain:
    """Admit ``runs`` no-ops, then drain them with ``workers`` fresh worker processes."""
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        after = await journal_tail(conn)
        await admit(settings, runs)
        began = time.perf_counter()
        procs = [
            runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
            for _ in range(workers)
        ]
        try:
            await wait_settled(conn, after, runs, procs, timeout)
            wall = time.perf_counter() - began
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
        return Drain(runs, wall, await window_s(conn, after))


async def durability(url: str) -> tuple[str, str, str]:
    """The server's (fsync, synchronous_commit, full_page_writes)."""
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        row = await (await conn.execute(q("bench.durability_settings"))).fetchone()
    assert row is not None
    return str(row["fsync"]), str(row["synchronous_commit"]), str(row["full_page_writes"])


async def drop_keys(redis_url: str, prefix: str) -> None:
    """Every Redis key a benchmark's prefix left behind."""
    from runfleet.broker.client import connect

    redis = connect(redis_url)
    try:
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
        for start in range(0, len(keys), 1000):
            await redis.delete(*keys[start : start + 1000])
    finally:
        await redis.aclose()
