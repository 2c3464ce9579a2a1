"""``runfleet bench limits``: what a queue's limits cost the claim path, counted by Postgres.

The bound: the limits add at most one statement per claim batch. One worker
process drains the same zero-step batch on its own throwaway servers (as ``bench
capacity``) under four settings of the queue: unlimited; a concurrency and a rate that
never bind (every claim takes the queue row's lock and a token); a rate that binds (the
refused claims, the gate and the token pump); and keyed (every run its own key: the
round-robin visits the keys in the claim statement). ``pg_stat_statements`` counts the
claim statements (each calls ``queue_free_slots`` or ``start_grant``), the reads the
limits add beside them (a refusal's wait, the pump's bucket, a key's state) and every
statement, per run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.table import Table

from runfleet.ops.bench.capacity import BATCH, FLOWS_MODULE, zero_steps
from runfleet.ops.bench.procs import runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError
from runfleet.ops.bench.three_steps import QUEUE
from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q
from runfleet.store.types import RunStatus


@dataclass(frozen=True, slots=True)
class LimitCost:
    setting: str
    claims_per_run: float
    limit_reads_per_run: float
    statements_per_run: float
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "claim_statements_per_run": round(self.claims_per_run, 3),
            "limit_reads_per_run": round(self.limit_reads_per_run, 3),
            "statements_per_run": round(self.statements_per_run, 3),
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True, slots=True)
class Limits:
    runs: int
    concurrency: int
    rate_per_s: float
    costs: list[LimitCost]

    def as_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "concurrency": self.concurrency,
            "binding_rate_per_s": self.rate_per_s,
            "settings": [c.as_json() for c in self.costs],
        }


def _counts(conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[int, int, int]:
    row = conn.execute(q("bench.limits_counters")).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def run(base: Settings, *, runs: int, concurrency: int, rate_per_s: float) -> Limits:
    pgss = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
            "pg_stat_statements.max": "5000"}  # fmt: skip
    with ThrowawayPostgres(extra_settings=pgss) as pg, ThrowawayRedis() as rd:
        await migrate(pg.url)
        settings = base.model_copy(update={"database_url": pg.url, "redis_url": rd.url})
        costs = []
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(q("bench.capacity_extension"))
            store = await Store.open(settings)
            worker = runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE,
                                     concurrency=concurrency)  # fmt: skip
            try:
                await wait_workers_started(settings, [worker], timeout=60)
                await asyncio.sleep(2)
                plans: list[tuple[str, dict[str, Any]]] = [
                    ("unlimited", {}),
                    ("concurrency 1,000,000 + rate 1,000,000/s (not binding)",
                     {"concurrency": 1_000_000, "rate_per_s": 1_000_000}),
                    (f"rate {rate_per_s:g}/s (binding)", {"concurrency": 0,
                                                          "rate_per_s": rate_per_s}),
                    ("keyed: a key per run (args.0), round-robin",
                     {"rate_per_s": 0, "key_flow": (zero_steps.name, "args.0")}),
                ]  # fmt: skip
                for done, (setting, change) in enumerate(plans):
                    if change:
                        await store.queues.set(QUEUE, **change)
                    before, started = _counts(conn), time.monotonic()
                    await _drain(settings, store, runs, runs * (done + 1))
                    after, took = _counts(conn), time.monotonic() - started
                    costs.append(
                        LimitCost(
                            setting,
                            (after[0] - before[0]) / runs,
                            (after[1] - before[1]) / runs,
                            (after[2] - before[2]) / runs,
                            took,
                        )
                    )
            finally:
                worker.close()
                await store.close()
    return Limits(runs, concurrency, rate_per_s, costs)


async def _drain(settings: Settings, store: Store, runs: int, completed: int) -> None:
    """Admit ``runs`` zero-step runs and wait until ``completed`` of them all are done."""
    async with AsyncQueue(QUEUE, settings=settings) as queue:
        for start in range(0, runs, BATCH):
            count = min(BATCH, runs - start)
            await queue.enqueue_many([EnqueueSpec(zero_steps, (start + i,)) for i in range(count)])
    deadline = time.monotonic() + 300
    while (await store.stats.status_counts(flow=zero_steps.name))[RunStatus.COMPLETED] < completed:
        if time.monotonic() > deadline:
            raise BenchError(f"{zero_steps.name}: not {completed} completed after 300 s")
        await asyncio.sleep(0.05)


def table(result: Limits) -> Table:
    table = Table(
        title=f"queue limits: {result.runs} zero-step runs per setting, one worker process, "
        f"concurrency {result.concurrency}"
    )
    for title in ("setting", "claim statements / run", "limit reads / run", "all statements / run",
                  "drain s"):  # fmt: skip
        table.add_column(title, justify="left" if title == "setting" else "right")
    for c in result.costs:
        table.add_row(c.setting, f"{c.claims_per_run:.3f}", f"{c.limit_reads_per_run:.3f}",
                      f"{c.statements_per_run:.2f}", f"{c.seconds:.1f}")  # fmt: skip
    return table
