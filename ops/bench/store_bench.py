"""The store benchmark: durable run lifecycles per second against this server's commit rate.

A lifecycle is what the driver commits for a run whose flow does nothing: admission (row +
``created`` record), claim-and-activate (CAS + record), settlement (CAS + record, clocks
closed, cascade checked) — three transactions, each on its own, as the real driver does.
The baseline is the same number of tasks committing one-row INSERTs, one transaction each,
into a scratch table of the same database: the best case for a commit on this server. The
ratio says how much of that ceiling runfleet's bookkeeping leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.store import Settings, Store, settlements
from runfleet.store.migrate import migrate
from runfleet.store.queries import q
from runfleet.store.types import Activated, Created, NewRun, Owner, Transitioned

TRANSACTIONS_PER_LIFECYCLE = 3

# The baseline's own table and statement: the yardstick, in store/sql/bench.sql.
BASELINE_TABLE = q("bench.baseline_table")
BASELINE_INSERT = q("bench.baseline_insert")


@dataclass(frozen=True, slots=True)
class Phase:
    """Timed work: ``units`` lifecycles (or commits) making ``transactions`` commits in all."""

    units: int
    transactions: int
    seconds: float
    latencies_ms: tuple[float, ...]

    @property
    def units_per_s(self) -> float:
        return self.units / self.seconds

    @property
    def transactions_per_s(self) -> float:
        return self.transactions / self.seconds

    def percentile(self, q: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else 0.0
        cuts = statistics.quantiles(self.latencies_ms, n=100, method="inclusive")
        return cuts[q - 1]

    def as_json(self) -> dict[str, float | int]:
        return {
            "units": self.units,
            "transactions": self.transactions,
            "seconds": round(self.seconds, 4),
            "units_per_s": round(self.units_per_s, 1),
            "transactions_per_s": round(self.transactions_per_s, 1),
            "p50_ms": round(self.percentile(50), 3),
            "p99_ms": round(self.percentile(99), 3),
        }


@dataclass(frozen=True, slots=True)
class StoreBenchResult:
    runs: int
    concurrency: int
    server_version: str
    synchronous_commit: str
    runfleet: Phase
    baseline: Phase

    @property
    def lifecycle_ratio(self) -> float:
        """Runfleet lifecycles/s per baseline commit/s (1/3 would be a perfect 3-commit run)."""
        return self.runfleet.units_per_s / self.baseline.transactions_per_s

    @property
    def transaction_ratio(self) -> float:
        """Runfleet transactions/s per baseline commit/s: 1.0 means no bookkeeping cost."""
        return self.runfleet.transactions_per_s / self.baseline.transactions_per_s

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": "store",
            "runs": self.runs,
            "concurrency": self.concurrency,
            "server_version": self.server_version,
            "synchronous_commit": self.synchronous_commit,
            "runfleet": self.runfleet.as_json(),
            "baseline": self.baseline.as_json(),
            "lifecycle_ratio": round(self.lifecycle_ratio, 4),
            "transaction_ratio": round(self.transaction_ratio, 4),
        }


async def _spread(total: int, concurrency: int, work: Callable[[int], Awaitable[None]]) -> Phase:
    """Run ``work(0..total-1)`` on ``concurrency`` tasks pulling from one counter."""
    indices = itertools.count()
    latencies: list[float] = []

    async def task() -> None:
        for i in indices:
            if i >= total:
                return
            began = time.perf_counter()
            await work(i)
            latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(task())
    return Phase(total, total, time.perf_counter() - began, tuple(latencies))


async def _lifecycle(store: Store, me: Owner, run_id: str) -> None:
    """Admit, claim-and-activate and complete one run: three transactions, three records."""
    created = await store.admission.create(NewRun(id=run_id, flow="bench.noop", payload={"n": 1}))
    if not isinstance(created, Created):
        raise BenchError(f"{run_id}: admission answered {created!r}")
    activated = await store.runs.claim_and_activate(run_id, created.row.snapshot, me)
    if not isinstance(activated, Activated):
        raise BenchError(f"{run_id}: claim answered {activated!r}")
    settled = await store.lifecycle.settle(
        me, settlements.completed(run_id, activated.row.epoch, None)
    )
    if not isinstance(settled, Transitioned):
        raise BenchError(f"{run_id}: settlement answered {settled!r}")


def _merge(phases: list[Phase], transactions_per_unit: int) -> Phase:
    units = sum(p.units for p in phases)
    return Phase(
        units,
        units * transactions_per_unit,
        sum(p.seconds for p in phases),
        tuple(ms for p in phases for ms in p.latencies_ms),
    )


async def _open_baseline_pool(
    url: str, concurrency: int
) -> AsyncConnectionPool[AsyncConnection[Any]]:
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        url,
        min_size=concurrency,
        max_size=concurrency,
        kwargs={"autocommit": True},
        open=False,
        name="bench-baseline",
    )
    await pool.open(wait=True, timeout=30)
    async with pool.connection() as conn:
        await conn.execute(BASELINE_TABLE)
    return pool


async def _measure(
    url: str, runs: int, concurrency: int, warmup: int, rounds: int
) -> tuple[Phase, Phase]:
    """Alternate runfleet and baseline rounds, so load from elsewhere hits both alike.

    Each baseline round commits as many transactions as the runfleet round before it.
    """
    settings = Settings(database_url=url)
    me = Owner.for_this_process(settings.host_id)
    tag = secrets.token_hex(3)
    ours: list[Phase] = []
    theirs: list[Phase] = []
    async with AsyncExitStack() as stack:
        store = await Store.open(
            settings, source_id="bench", min_size=concurrency, max_size=concurrency
        )
        stack.push_async_callback(store.close)
        pool = await _open_baseline_pool(url, concurrency)
        stack.push_async_callback(pool.close)

        def lifecycles(prefix: str) -> Callable[[int], Awaitable[None]]:
            return lambda i: _lifecycle(store, me, f"{prefix}-{i}")

        async def commit(i: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(BASELINE_INSERT, (Jsonb({"n": i}),))

        await _spread(warmup, concurrency, lifecycles(f"w-{tag}"))
        await _spread(warmup * TRANSACTIONS_PER_LIFECYCLE, concurrency, commit)
        for r in range(rounds):
            share = runs // rounds + (1 if r < runs % rounds else 0)
            if share == 0:
                continue
            ours.append(await _spread(share, concurrency, lifecycles(f"b-{tag}-{r}")))
            theirs.append(await _spread(share * TRANSACTIONS_PER_LIFECYCLE, concurrency, commit))
    return _merge(ours, TRANSACTIONS_PER_LIFECYCLE), _merge(theirs, 1)


async def _server_facts(url: str) -> tuple[str, str]:
    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SHOW synchronous_commit")
        row = await cur.fetchone()
        version = conn.info.server_version
    major, minor = divmod(version, 10000)
    return f"{major}.{minor}", str(row[0]) if row else "?"


async def run(
    admin_url: str, *, runs: int, concurrency: int, warmup: int, rounds: int = 3
) -> StoreBenchResult:
    """Benchmark in a scratch database on ``admin_url``'s server; the database is dropped."""
    if runs < 1 or concurrency < 1 or warmup < 0 or rounds < 1:
        raise BenchError("runs, concurrency and rounds must be >= 1, warmup >= 0")
    async with scratch_database(admin_url) as url:
        await migrate(url)
        version, sync_commit = await _server_facts(url)
        runfleet, baseline = await _measure(url, runs, concurrency, warmup, rounds)
    return StoreBenchResult(runs, concurrency, version, sync_commit, runfleet, baseline)
