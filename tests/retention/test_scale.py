"""Pruning 100,000 settled runs while a worker drives runs: nobody waits on a prune's locks
for longer than one batch, and a row another transaction holds is skipped, never waited for."""

from __future__ import annotations

import asyncio
import statistics
import time

from psycopg import AsyncConnection

import tests.retention.flows as flows
from broker import AsyncQueue
from store import Store
from store.config import Settings
from store.retention import Retention
from tests.retention.test_prune import runs_by_status
from worker.process import Worker

SETTLED = 100_000
BATCH = 500
DAY_MS = 86_400_000


async def _bulk_settled(database_url: str, n: int) -> None:
    """n completed runs settled a day ago, two journal records each: set-based, seconds."""
    async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            """
            INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,
                                       created_at_ms, updated_at_ms)
            SELECT 'old-' || g, 'retention.leaf', 'default', 'completed', '{}'::jsonb,
                   'old-' || g, runfleet.now_ms() - %(day)s - 1000,
                   runfleet.now_ms() - %(day)s + g
              FROM generate_series(1, %(n)s) AS g
            """,
            {"n": n, "day": DAY_MS},
        )
        await conn.execute(
            """
            INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload,
                                          digest, at_ms)
            SELECT 'old-' || (g / 2 + 1), CASE WHEN g %% 2 = 0 THEN 'created'
                                             ELSE 'transitioned' END,
                   'bulk', g, '{}'::jsonb, 'x', runfleet.now_ms() - %(day)s
              FROM generate_series(0, 2 * %(n)s - 1) AS g
            """,
            {"n": n, "day": DAY_MS},
        )
        await conn.execute("ANALYZE runfleet.runs")
        await conn.execute("ANALYZE runfleet.journal")


class LockWatch:
    """Samples every backend of the database waiting on a lock, and for how long."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self.longest_wait_s = 0.0
        self.waits: list[str] = []
        self.behind_prune = 0
        """Samples of a backend waiting on a lock the prune statement holds."""
        self.samples = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with await AsyncConnection.connect(self._url, autocommit=True) as conn:
            while not stop.is_set():
                cur = await conn.execute(
                    """
                    SELECT extract(epoch FROM clock_timestamp() - a.query_start), a.query,
                           EXISTS (SELECT 1 FROM pg_stat_activity b
                                    WHERE b.pid = ANY (pg_blocking_pids(a.pid))
                                      AND b.query LIKE '%%del_journal%%')
                      FROM pg_stat_activity a
                     WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
                       AND a.pid <> pg_backend_pid()
                    """
                )
                for waited, query, behind_prune in await cur.fetchall():
                    self.longest_wait_s = max(self.longest_wait_s, float(waited))
                    self.waits.append(str(query)[:80])
                    self.behind_prune += bool(behind_prune)
                self.samples += 1
                await asyncio.sleep(0.01)


async def test_pruning_100k_never_blocks_a_working_fleet(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings, database_url: str
) -> None:
    t0 = time.monotonic()
    await _bulk_settled(database_url, SETTLED)
    inserted_s = time.monotonic() - t0
    retention = Retention(store.db)
    before_ms, now_ms = await retention.cutoff(3_600_000)

    stop = asyncio.Event()
    watch = LockWatch(database_url)
    watcher = asyncio.create_task(watch.run(stop))
    prune = asyncio.create_task(retention.prune(before_ms, now_ms, batch=BATCH))
    latencies: list[float] = []
    driven = 0
    while not prune.done():  # the worker drives runs for the whole prune
        wave = time.monotonic()
        runs = [await queue.enqueue(flows.leaf, i) for i in range(8)]
        for run in runs:
            await run.result(timeout=30)
        latencies.append(time.monotonic() - wave)
        driven += len(runs)
    done = await prune
    stop.set()
    await watcher

    print(
        f"\ninserted {SETTLED} runs + {2 * SETTLED} journal rows in {inserted_s:.1f} s; "
        f"pruned in {done.batches} batches, longest {done.longest_batch_s * 1000:.0f} ms; "
        f"worker drove {driven} runs meanwhile, wave p50 "
        f"{statistics.median(latencies) * 1000:.0f} ms max {max(latencies) * 1000:.0f} ms; "
        f"lock samples {watch.samples}, waits seen {len(watch.waits)}, "
        f"longest wait {watch.longest_wait_s * 1000:.0f} ms"
        f" ({watch.behind_prune} behind the prune)"
    )
    assert done.complete and done.deleted.runs == SETTLED
    assert done.deleted.journal == 2 * SETTLED
    assert driven >= 8 and watch.samples > 10
    # Nobody (worker, producer) waited on a lock for longer than one batch took.
    assert watch.longest_wait_s <= done.longest_batch_s + 0.05, watch.waits
    remaining = await runs_by_status(store)
    assert len(remaining) == driven and not any(k.startswith("old-") for k in remaining)


async def test_a_held_row_is_skipped_not_waited_for(
    worker: Worker, queue: AsyncQueue, store: Store, database_url: str
) -> None:
    runs = [await queue.enqueue(flows.leaf, i) for i in range(3)]
    for run in runs:
        await run.result(timeout=20)
    retention = Retention(store.db)
    now = await store.stats.now_ms() + 1
    async with await AsyncConnection.connect(database_url) as holder:
        # What `complete` on a settled run does: lock the row, then decide.
        await holder.execute("SELECT 1 FROM runfleet.runs WHERE id = %s FOR UPDATE", [runs[0].id])
        started = time.monotonic()
        done = await asyncio.wait_for(retention.prune(now, now, batch=2), 5)
        assert time.monotonic() - started < 2
        assert done.deleted.runs == 2
        assert set(await runs_by_status(store)) == {runs[0].id}
        await holder.rollback()
    assert (await retention.prune(now, now)).deleted.runs == 1
    assert await runs_by_status(store) == {}
