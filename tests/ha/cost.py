"""What synchronous replication costs, measured: ``python -m tests.ha.cost [ROUNDS]``.

For each round, a synchronous and then an asynchronous throwaway Patroni cluster (a
primary and a standby on this machine): one producer's sequential admissions per
second, ``enqueue_many`` batches of 100 per second, and two worker processes' drain
rate of 300 two-step flows. Rounds alternate the modes so a loaded machine's noise
falls on both. Prints one line per measurement and the medians.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import psycopg

import tests.chaos.flows as cf
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.fleet.procs import WorkerProc
from tests.servers.patroni import PatroniCluster

SEQUENTIAL = 300
BATCHES = 5
DRAIN = 300


async def measure(synchronous: bool, redis_url: str) -> tuple[float, float, float]:
    with PatroniCluster(synchronous=synchronous) as cluster:
        url = cluster.url()
        await migrate(url)
        cfg = Settings(database_url=url, redis_url=redis_url, redis_prefix=f"cost{time.time_ns()}")
        async with AsyncQueue("default", settings=cfg) as queue:
            started = time.monotonic()
            for i in range(SEQUENTIAL):
                await queue.enqueue(cf.two_steps, f"s{i}")
            sequential = SEQUENTIAL / (time.monotonic() - started)
            started = time.monotonic()
            for b in range(BATCHES):
                await queue.enqueue_many(
                    [EnqueueSpec(cf.two_steps, (f"b{b}-{i}",)) for i in range(100)]
                )
            batched = BATCHES * 100 / (time.monotonic() - started)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("DELETE FROM runfleet.runs")
        async with AsyncQueue("default", settings=cfg) as queue:
            await queue.enqueue_many([EnqueueSpec(cf.two_steps, (f"d{i}",)) for i in range(DRAIN)])
        workers = [WorkerProc(cfg, flows="tests.chaos.flows", concurrency=16) for _ in range(2)]
        try:
            started = time.monotonic()
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                while True:
                    cur = await conn.execute(
                        "SELECT count(*) FROM runfleet.runs WHERE status <> 'completed'"
                    )
                    row = await cur.fetchone()
                    if row is not None and row[0] == 0:
                        break
                    await asyncio.sleep(0.1)
            drained = DRAIN / (time.monotonic() - started)
        finally:
            for w in workers:
                w.close()
    return sequential, batched, drained


async def main(rounds: int) -> None:
    seen: dict[str, list[tuple[float, float, float]]] = {"sync": [], "async": []}
    with ThrowawayRedis() as redis:
        for r in range(rounds):
            for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                got = await measure(mode == "sync", redis.url)
                seen[mode].append(got)
                print(f"{mode}: enqueue {got[0]:.0f}/s, enqueue_many {got[1]:.0f}/s, "
                      f"drain {got[2]:.0f} flows/s", flush=True)  # fmt: skip
    for mode, rows in seen.items():
        med = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(f"median {mode}: enqueue {med[0]:.0f}/s, enqueue_many {med[1]:.0f}/s, "
              f"drain {med[2]:.0f} flows/s")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
