"""Pruning 100,000 settled runs while a worker drives runs: nobody waits on a prune's locks
for longer than one batch, and a row another transaction holds is skipped, never waited for."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

from psycopg import AsyncConnection

import tests.retention.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.retention import Retention
from runfleet.worker.process import Worker
from tests.retention.test_prune import runs_by_status

SETTLED = 100_000
BATCH = 500
DAY_MS = 86_400_000


async def _bulk_settled(database_url: str, n: int, records: int = 2) -> None:
    """n completed runs settled a day ago, ``records`` journal records each: set-based."""
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
            SELECT 'old-' || (g / %(k)s::int + 1), CASE WHEN g %% %(k)s::int = 0 THEN 'created'
                                                ELSE 'transitioned' END,
                   'bulk', g, '{}'::jsonb, 'x', runfleet.now_ms() - %(day)s
              FROM generate_series(0, %(k)s::int * %(n)s::int - 1) AS g
            """,
            {"n": n, "k": records, "day": DAY_MS},
        )
        await conn.execute("ANALYZE runfleet.runs")
        await conn.execute("ANALYZE runfleet.journal")


PRUNE_TEXT = "-- One batch: scan up to%"
"""How the prune statement starts in pg_stat_activity (whose text is cut at 1 kB)."""


class LockWatch:
    """Samples every backend of the database waiting on a lock, and for how long.

    A wait counts as *behind the prune* when one of the backends blocking it
    (``pg_blocking_pids``) is executing the prune statement. Waits between worker
    statements themselves (a renewal behind a settlement of the same run) are
    recorded too but are not the prune's doing.
    """

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self.longest_wait_s = 0.0
        self.longest_behind_prune_s = 0.0
        self.waits: list[str] = []
        self.behind_prune = 0
        """Samples of a backend waiting on a lock the prune statement holds."""
        self.prune_seen = 0
        """Samples in which the prune statement was executing (the watch can see it)."""
        self.samples = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with await AsyncConnection.connect(self._url, autocommit=True) as conn:
            while not stop.is_set():
                cur = await conn.execute(
                    """
                    SELECT extract(epoch FROM clock_timestamp() - a.query_start), a.query,
                           EXISTS (SELECT 1 FROM pg_stat_activity b
                                    WHERE b.pid = ANY (pg_blocking_pids(a.pid))
                                      AND b.query LIKE %(prune)s)
                      FROM pg_stat_activity a
                     WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
                       AND a.pid <> pg_backend_pid()
                    """,
                    {"prune": PRUNE_TEXT},
                )
                for waited, query, behind_prune in await cur.fetchall():
                    self.longest_wait_s = max(self.longest_wait_s, float(waited))
                    self.waits.append(str(query)[:80])
                    if behind_prune:
                        self.behind_prune += 1
                        self.longest_behind_prune_s = max(
                            self.longest_behind_prune_s, float(waited)
                        )
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'active' AND query LIKE %(prune)s",
                    {"prune": PRUNE_TEXT},
                )
                row = await cur.fetchone()
                self.prune_seen += bool(row and row[0])
                self.samples += 1
                await asyncio.sleep(0.01)


@dataclass
class Answers:
    """Locks taken on runs being pruned: how many found the row held, and how long each waited."""

    taken: int = 0
    contended: int = 0
    waits: list[float] = field(default_factory=lambda: [0.0])


async def _answer_oldest(database_url: str, stop: asyncio.Event, answers: Answers) -> None:
    """Lock the oldest settled run left, as ``complete`` on it would, again and again.

    The oldest run left is one the prune's current batch is deleting, so this is the
    statement most exposed to the prune's locks. Its xmax, read without locking, tells
    whether a batch holds the row right now (only the prune locks these rows); then a
    real, waiting lock measures how long the prune makes it wait: at most one batch.
    """
    async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
        while not stop.is_set():
            cur = await conn.execute(
                "SELECT id FROM runfleet.runs WHERE id LIKE 'old-%%' AND status = 'completed'"
                " ORDER BY updated_at_ms LIMIT 1"
            )
            row = await cur.fetchone()
            if row is None:
                return
            answers.taken += 1
            cur = await conn.execute(
                "SELECT xmax::text <> '0' FROM runfleet.runs WHERE id = %s", [row[0]]
            )
            held = await cur.fetchone()
            if held is not None and held[0]:  # a batch holds it: lock it as `complete` would
                answers.contended += 1
                started = time.monotonic()
                await conn.execute("SELECT 1 FROM runfleet.runs WHERE id = %s FOR UPDATE", [row[0]])
                answers.waits.append(time.monotonic() - started)
            await asyncio.sleep(0.002)


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
    answers = Answers()
    answerer = asyncio.create_task(_answer_oldest(database_url, stop, answers))
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
    await answerer
    # Runs the answerer held when a batch reached them were skipped, not waited for.
    rest = await retention.prune(before_ms, now_ms, batch=BATCH)

    print(
        f"\ninserted {SETTLED} runs + {2 * SETTLED} journal rows in {inserted_s:.1f} s; "
        f"pruned in {done.batches} batches, longest {done.longest_batch_s * 1000:.0f} ms, "
        f"{rest.deleted.runs} skipped while held; "
        f"worker drove {driven} runs meanwhile, wave p50 "
        f"{statistics.median(latencies) * 1000:.0f} ms max {max(latencies) * 1000:.0f} ms; "
        f"{answers.taken} locks on runs being pruned, {answers.contended} found the row held"
        f" and waited up to {max(answers.waits) * 1000:.0f} ms; "
        f"lock samples {watch.samples}, waits seen "
        f"{len(watch.waits)}, longest {watch.longest_wait_s * 1000:.0f} ms"
        f" ({watch.behind_prune} behind the prune, longest"
        f" {watch.longest_behind_prune_s * 1000:.0f} ms); prune seen in {watch.prune_seen}"
    )
    assert done.complete and done.deleted.runs + rest.deleted.runs == SETTLED
    assert done.deleted.journal + rest.deleted.journal == 2 * SETTLED
    assert driven >= 8 and watch.samples > 10 and answers.taken > 10
    assert watch.prune_seen > 0, "the watch never saw the prune statement: it cannot judge"
    assert answers.contended > 0, "no lock ever met the prune's: the race never ran"
    # No statement waited behind the prune's locks for longer than one batch took.
    slack = 0.1  # scheduling on a loaded 2-core machine
    assert watch.longest_behind_prune_s <= done.longest_batch_s + slack, watch.waits
    assert max(answers.waits) <= done.longest_batch_s + slack
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


async def test_a_lock_on_a_run_being_pruned_waits_for_one_batch_only(
    store: Store, database_url: str
) -> None:
    """One deliberately large batch: a lock on one of its runs (``complete`` on a settled
    run) that meets the prune's waits until that batch commits, then finds the run gone.

    Twenty journal records per run make the batch's deletion (while it holds its row
    locks) most of its time, so the lock below meets it.
    """
    n = 10_000
    await _bulk_settled(database_url, n, records=20)
    retention = Retention(store.db)
    before_ms, now_ms = await retention.cutoff(3_600_000)
    target = f"old-{n // 2}"
    prune = asyncio.create_task(retention.prune(before_ms, now_ms, batch=n))
    waited: float | None = None
    async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
        while not prune.done() and waited is None:
            # Watch the row without locking it (a lock here would make the batch skip it):
            # a non-zero xmax means a transaction (the prune) has locked or deleted it.
            cur = await conn.execute(
                "SELECT xmax::text <> '0' FROM runfleet.runs WHERE id = %s", [target]
            )
            row = await cur.fetchone()
            if row is None:
                break  # already deleted and committed: the lock came too late
            if row[0]:  # the batch holds it: now lock it, as `complete` would
                started = time.monotonic()
                cur = await conn.execute(
                    "SELECT 1 FROM runfleet.runs WHERE id = %s FOR UPDATE", [target]
                )
                gone = await cur.fetchone() is None
                waited = time.monotonic() - started
                assert gone, "the run the lock waited for was deleted by the batch"
            await asyncio.sleep(0.001)
    done = await prune
    print(f"\none batch of {n} took {done.longest_batch_s * 1000:.0f} ms; a lock met it"
          f" and waited {None if waited is None else round(waited * 1000)} ms")  # fmt: skip
    assert waited is not None, "the lock never met the batch's (it ran before or after it)"
    assert done.batches <= 2 and done.deleted.runs == n
    assert waited <= done.longest_batch_s + 0.1
