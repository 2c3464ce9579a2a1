"""How the fleet's drain scales: with processes, with disk flushes, with history.

Every row is a drain of a standing backlog of no-op runs (``bench.drain``), runfleet
beside rq where rq has an equivalent:

- processes: the same backlog drained by 1, 2 and 4 worker processes on each side,
  one count after the other (rq, then runfleet), so a change in the machine's load
  hits both sides of a row alike;
- fsync: runfleet's drain on a server that flushes every commit and on one that does
  not (``bench.durability``), each beside rq's drain at the same process count;
- history: the drain in a fresh database (after an untimed warm-up drain), then again
  after 1,000,000 settled runs and their journal records were written into it
  (``bench.history_*``: one INSERT ... SELECT generate_series each, then ANALYZE). The
  cost of a run must not grow with history.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.table import Table

from bench import rq_side
from bench.drain import drop_keys, runfleet_drain
from bench.durability import Target, targets
from bench.noop import QUEUE, noop_flow
from bench.rq_side import Drain
from bench.servers import Servers, bench_prefix
from runfleet.ops.bench.scratch import scratch_database
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q

HISTORY_WITHIN = 0.9
"""The history case's target: drain with the history >= 0.9x the fresh database's."""


def _ratio(mine: float, theirs: float) -> float:
    return mine / theirs if theirs else float("inf")


@dataclass(frozen=True, slots=True)
class ScaleRow:
    workers: int
    runfleet: Drain
    rq: Drain

    @property
    def ratio(self) -> float:
        return _ratio(self.runfleet.window_rate, self.rq.window_rate)

    def as_json(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "runfleet": self.runfleet.as_json(),
            "rq": self.rq.as_json(),
            "ratio": round(self.ratio, 3),
        }


@dataclass(frozen=True, slots=True)
class FsyncRow:
    target: Target
    drain: Drain

    def as_json(self) -> dict[str, Any]:
        return {
            **self.target.as_json(),
            "drain": self.drain.as_json(),
        }


@dataclass(frozen=True, slots=True)
class History:
    rows: int
    fill_s: float
    empty: Drain
    full: Drain

    @property
    def ratio(self) -> float:
        return _ratio(self.full.window_rate, self.empty.window_rate)

    def as_json(self) -> dict[str, Any]:
        return {
            "settled_runs": self.rows,
            "journal_records": 3 * self.rows,
            "fill_s": round(self.fill_s, 1),
            "empty": self.empty.as_json(),
            "with_history": self.full.as_json(),
            "ratio": round(self.ratio, 3),
        }


async def process_counts(
    settings: Settings, redis_url: str, *, counts: tuple[int, ...], runs: int, concurrency: int
) -> tuple[ScaleRow, ...]:
    """The same ``runs`` drained with each process count, rq then runfleet."""
    found: list[ScaleRow] = []
    for workers in counts:
        theirs = await asyncio.to_thread(rq_side.drain, redis_url, runs=runs, workers=workers)
        mine = await runfleet_drain(settings, runs=runs, workers=workers, concurrency=concurrency)
        found.append(ScaleRow(workers, mine, theirs))
    return tuple(found)


async def fsync_rows(
    servers: Servers, *, runs: int, workers: int, concurrency: int
) -> tuple[FsyncRow, ...]:
    """Runfleet's drain on each durability target (a scratch database on each)."""
    found: list[FsyncRow] = []
    async with targets(servers) as chosen:
        for target in chosen:
            async with scratch_database(target.admin_url, "rf_bench_fsync") as url:
                await migrate(url)
                settings = Settings(
                    database_url=url,
                    redis_url=servers.redis_url,
                    redis_prefix=bench_prefix("fsync"),
                )
                try:
                    drain = await runfleet_drain(
                        settings, runs=runs, workers=workers, concurrency=concurrency
                    )
                finally:
                    await drop_keys(servers.redis_url, settings.redis_prefix)
            found.append(FsyncRow(target, drain))
    return tuple(found)


async def fill_history(url: str, rows: int) -> float:
    """``rows`` settled no-op runs and three journal records each, analyzed: seconds."""
    began = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        params = {"rows": rows, "flow": noop_flow.name, "queue": QUEUE}
        await conn.execute(q("bench.history_runs"), params)
        await conn.execute(q("bench.history_journal"), {"rows": rows})
        await conn.execute(q("bench.history_analyze"))
    return time.perf_counter() - began


async def history(
    servers: Servers, *, rows: int, runs: int, workers: int, concurrency: int
) -> History:
    """Drain in a fresh database, fill it with ``rows`` settled runs, drain again."""
    async with scratch_database(servers.database_url, "rf_bench_history") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("history")
        )
        try:
            # Untimed: a new database's first drain also pays for cold caches and catalogs,
            # which would flatter the history drain that follows.
            await runfleet_drain(
                settings, runs=max(1, runs // 10), workers=workers, concurrency=concurrency
            )
            empty = await runfleet_drain(
                settings, runs=runs, workers=workers, concurrency=concurrency
            )
            fill_s = await fill_history(url, rows)
            full = await runfleet_drain(
                settings, runs=runs, workers=workers, concurrency=concurrency
            )
        finally:
            await drop_keys(servers.redis_url, settings.redis_prefix)
    return History(rows, fill_s, empty, full)


def add_rows(
    t: Table,
    *,
    scale: tuple[ScaleRow, ...],
    fsync: tuple[FsyncRow, ...],
    rq_drain: Drain,
    rq_workers: int,
    past: History | None,
) -> None:
    """The scaling rows of the fleet table (columns: what, runfleet, rq, ratio)."""
    for row in scale:
        t.add_row(
            f"drain, {row.workers} process{'es' if row.workers > 1 else ''}, "
            f"{row.runfleet.runs:,} runs (runs/s)",
            f"{row.runfleet.window_rate:,.0f}",
            f"{row.rq.window_rate:,.0f}",
            f"{row.ratio:.2f}x",
        )
    for frow in fsync:
        t.add_row(
            f"drain, {frow.target.label}, {rq_workers} processes (runs/s; rq from the "
            "headline drain)",
            f"{frow.drain.window_rate:,.0f}",
            f"{rq_drain.window_rate:,.0f}",
            f"{_ratio(frow.drain.window_rate, rq_drain.window_rate):.2f}x",
        )
    if past is not None:
        t.add_row(
            f"drain, fresh database -> with {past.rows:,} settled runs + journal "
            f"(filled in {past.fill_s:.0f} s) (runs/s)",
            f"{past.empty.window_rate:,.0f} -> {past.full.window_rate:,.0f}",
            "n/a",
            f"{past.ratio:.2f}x",
        )


def targets_of(scale: tuple[ScaleRow, ...], past: History | None) -> dict[str, tuple[str, bool]]:
    found: dict[str, tuple[str, bool]] = {}
    for row in scale:
        processes = f"{row.workers} process{'es' if row.workers > 1 else ''}"
        found[f"drain, {processes} >= 3x rq SimpleWorker"] = (
            f"{row.ratio:.2f}x",
            row.ratio >= 3,
        )
    if past is not None:
        found[f"drain with {past.rows:,} settled runs within 10% of a fresh database"] = (
            f"{past.ratio:.2f}x",
            past.ratio >= HISTORY_WITHIN,
        )
    return found
