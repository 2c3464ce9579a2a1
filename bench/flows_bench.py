"""The flows benchmark: durable three-step flows on runfleet and on DBOS, same Postgres.

Both systems drain a standing backlog of ``flows`` flows (each three recorded steps of a
trivial function) with the same worker processes x concurrency; throughput is flows
over the window from the first start to the last finish, each system's own database
timestamps. DBOS polls its queue: it runs twice, at its default polling interval and at
a short one (its best case here), and the ratio is taken against the better of the two.

The fsync rows drain the same backlog on both systems again, on a server that flushes
every commit to disk and on one that does not (``bench.durability``: two throwaway
servers the bench starts, or the server the user named, as it is), DBOS at its shortest
polling interval of the run.

Then runfleet alone: how late a one-second ``ctx.sleep`` wakes, with short sleeps taken
in-process (the default, ``inline_sleep_max``) and with every sleep parked on a durable
timer (``RUNFLEET_INLINE_SLEEP_MAX=0``), which the due-clock sweep wakes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from bench import dbos_side
from bench.dbos_side import Throughput
from bench.drain import drop_keys
from bench.durability import Target, targets
from bench.figures import percentile
from bench.runfleet_side import wait_completed
from bench.servers import Servers, bench_prefix
from runfleet.ops.bench.procs import Proc, runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.ops.bench.three_steps import QUEUE, sleep_once, three_steps
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate

FLOWS_MODULE = "runfleet.ops.bench.three_steps"
TRACED_MODULE = "bench.three_steps_traced"
"""The same flows with OpenTelemetry's SDK installed (the tracing row, RUNFLEET_OTEL=1)."""
SLEEP_KEY = "sleep:sleep#1"


@dataclass(frozen=True, slots=True)
class SleepLateness:
    """How late ``runs`` one-second sleeps woke: wake minus due, in ms."""

    mode: str
    late_ms: tuple[float, ...]
    sleep_s: float

    def as_json(self) -> dict[str, Any]:
        p99 = percentile(self.late_ms, 99)
        return {
            "mode": self.mode,
            "runs": len(self.late_ms),
            "late_p50_ms": round(percentile(self.late_ms, 50), 1),
            "late_p99_ms": round(p99, 1),
            "late_max_ms": round(max(self.late_ms, default=0.0), 1),
            "sleep_p99_s": round(self.sleep_s + p99 / 1000, 3),
        }


@dataclass(frozen=True, slots=True)
class FsyncFlows:
    """Both systems' flows/s on one durability target (DBOS None when skipped)."""

    target: Target
    runfleet: Throughput
    dbos: Throughput | None
    polling: float | None

    @property
    def ratio(self) -> float | None:
        return self.runfleet.per_s / self.dbos.per_s if self.dbos else None

    def as_json(self) -> dict[str, Any]:
        return {
            **self.target.as_json(),
            "runfleet": self.runfleet.as_json(),
            "dbos": self.dbos.as_json() if self.dbos else None,
            "dbos_polling_s": self.polling,
            "ratio": round(self.ratio, 3) if self.ratio is not None else None,
        }


@dataclass(frozen=True, slots=True)
class FlowsBenchResult:
    flows: int
    workers: int
    concurrency: int
    runfleet: Throughput
    dbos: dict[float, Throughput]
    sleeps: tuple[SleepLateness, ...]
    fsync: tuple[FsyncFlows, ...] = ()
    traced: Throughput | None = None
    """runfleet's flows/s with RUNFLEET_OTEL on (every span recorded); None when skipped."""

    @property
    def tracing_cost(self) -> float | None:
        """Traced over untraced flows/s, measured in the same run (1.0: free)."""
        return self.traced.per_s / self.runfleet.per_s if self.traced else None

    @property
    def dbos_best(self) -> Throughput | None:
        return max(self.dbos.values(), key=lambda t: t.per_s, default=None)

    @property
    def ratio(self) -> float | None:
        best = self.dbos_best
        return self.runfleet.per_s / best.per_s if best else None

    def targets(self) -> dict[str, tuple[str, bool]]:
        found: dict[str, tuple[str, bool]] = {}
        if self.ratio is not None:
            found[">= 4x DBOS flows/s"] = (f"{self.ratio:.2f}x", self.ratio >= 4)
        for row in self.fsync:
            if row.ratio is not None:
                found[f">= 4x DBOS flows/s, fsync {row.target.fsync}"] = (
                    f"{row.ratio:.2f}x",
                    row.ratio >= 4,
                )
        for sleep in self.sleeps:
            total = sleep.sleep_s + percentile(sleep.late_ms, 99) / 1000
            found[f"1 s sleep wakes within 1.5 s p99 ({sleep.mode})"] = (
                f"{total:.2f} s",
                total <= 1.5,
            )
        return found

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": "flows",
            "flows": self.flows,
            "workers": self.workers,
            "concurrency": self.concurrency,
            "runfleet": self.runfleet.as_json(),
            "dbos": {f"polling_{p:g}s": t.as_json() for p, t in self.dbos.items()},
            "ratio_vs_best_dbos": round(self.ratio, 3) if self.ratio is not None else None,
            "sleeps": [s.as_json() for s in self.sleeps],
            "fsync": [row.as_json() for row in self.fsync],
            "traced": self.traced.as_json() if self.traced else None,
            "traced_over_untraced": (
                round(self.tracing_cost, 3) if self.tracing_cost is not None else None
            ),
            "targets": {k: {"measured": v[0], "met": v[1]} for k, v in self.targets().items()},
        }


def _workers(
    settings: Settings,
    count: int,
    concurrency: int,
    flows_module: str = FLOWS_MODULE,
    **env: object,
) -> list[Proc]:
    return [
        runfleet_worker(settings, flows=flows_module, queues=QUEUE, concurrency=concurrency, **env)
        for _ in range(count)
    ]


async def _runfleet_throughput(
    settings: Settings,
    store: Store,
    *,
    flows: int,
    workers: int,
    concurrency: int,
    flows_module: str = FLOWS_MODULE,
    **env: object,
) -> Throughput:
    async with AsyncQueue(QUEUE, settings=settings) as queue:
        await queue.enqueue_many([EnqueueSpec(three_steps, (i,)) for i in range(flows)])
    began = time.perf_counter()
    procs = _workers(settings, workers, concurrency, flows_module, **env)
    try:
        await wait_completed(store, three_steps.name, flows, procs, timeout=600)
        wall = time.perf_counter() - began
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
    starts = await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
    ends = await store.stats.records_of_kind(Kind.TRANSITIONED)
    if not starts or not ends:
        raise BenchError("the journal has no activation or settlement records")
    if await store.stats.settled_more_than_once():
        raise BenchError("a flow settled more than once")
    window = (max(r.at_ms for r in ends) - min(r.at_ms for r in starts)) / 1000
    return Throughput(flows, wall, window)


async def _sleep_lateness(
    settings: Settings,
    store: Store,
    *,
    mode: str,
    runs: int,
    seconds: float,
    gap_s: float,
    **env: object,
) -> SleepLateness:
    """``runs`` sleeps ``gap_s`` apart on one idle worker with a slot for each: how long
    after its clock's due time each flow went on (its wall clock; same host as Postgres)."""
    procs = _workers(settings, 1, runs + 8, FLOWS_MODULE, **env)
    try:
        await wait_workers_started(settings, procs, timeout=30)
        ids: list[str] = []
        async with AsyncQueue(QUEUE, settings=settings) as queue:
            if gap_s <= 0:  # a burst: every wake due at the same instant, in one process
                batch = await queue.enqueue_many([EnqueueSpec(sleep_once, (seconds,))] * runs)
                ids = [r.id for r in batch]
            for _ in range(runs if gap_s > 0 else 0):
                ids.append((await queue.enqueue(sleep_once, seconds)).id)
                await asyncio.sleep(gap_s)
        done = await store.stats.status_counts(flow=sleep_once.name)
        await wait_completed(store, sleep_once.name, sum(done.values()), procs, timeout=120)
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
    late: list[float] = []
    for row in await store.runs.get_many(ids):
        due = [r for r in await store.steps.of_run(row.id) if r.key == SLEEP_KEY]
        if not due or not isinstance(row.result, int):
            raise BenchError(f"run {row.id} has no sleep record or no wake time")
        output = due[0].output
        assert isinstance(output, dict)
        late.append(float(row.result - int(output["due_at_ms"])))
    return SleepLateness(mode, tuple(late), seconds)


async def run(
    servers: Servers,
    *,
    flows: int = 1000,
    workers: int = 2,
    concurrency: int = 32,
    dbos_polling: tuple[float, ...] = (1.0, 0.05),
    skip_dbos: bool = False,
    sleep_runs: int = 100,
    sleep_gap: float = 0.02,
    skip_sleep: bool = False,
    skip_fsync: bool = False,
    skip_tracing: bool = False,
) -> FlowsBenchResult:
    """The whole benchmark; every scratch database is dropped afterwards."""
    if flows < 1 or workers < 1 or concurrency < 1:
        raise BenchError("flows, workers and concurrency must be >= 1")
    if not skip_dbos and not dbos_side.available():
        raise BenchError(dbos_side.DBOS_MISSING)
    theirs: dict[float, Throughput] = {}
    for polling in () if skip_dbos else dbos_polling:
        theirs[polling] = await dbos_side.run(
            servers.database_url,
            flows=flows,
            workers=workers,
            concurrency=concurrency,
            polling=polling,
        )
    sleeps: list[SleepLateness] = []
    async with scratch_database(servers.database_url, "rf_bench_flows") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("flows")
        )
        store = await Store.open(settings, min_size=1, max_size=2)
        try:
            ours = await _runfleet_throughput(
                settings, store, flows=flows, workers=workers, concurrency=concurrency
            )
            if not skip_sleep:
                for mode, env in (
                    ("inline (default)", {}),
                    ("parked (inline_sleep_max=0)", {"inline_sleep_max": 0}),
                ):
                    sleeps.append(
                        await _sleep_lateness(
                            settings,
                            store,
                            mode=mode,
                            runs=sleep_runs,
                            seconds=1.0,
                            gap_s=sleep_gap,
                            **env,
                        )
                    )
        finally:
            await store.close()
            await drop_keys(servers.redis_url, settings.redis_prefix)
    fsync: tuple[FsyncFlows, ...] = ()
    if not skip_fsync:
        shortest = None if skip_dbos or not dbos_polling else min(dbos_polling)
        fsync = await _fsync_rows(
            servers, flows=flows, workers=workers, concurrency=concurrency, polling=shortest
        )
    traced = None
    if not skip_tracing:
        traced = await _traced_throughput(
            servers, flows=flows, workers=workers, concurrency=concurrency
        )
    return FlowsBenchResult(flows, workers, concurrency, ours, theirs, tuple(sleeps), fsync, traced)


async def _traced_throughput(
    servers: Servers, *, flows: int, workers: int, concurrency: int
) -> Throughput:
    """runfleet's flows/s with RUNFLEET_OTEL on and the SDK recording every span (a
    span per activation, step and attempt), in a scratch database of its own."""
    async with scratch_database(servers.database_url, "rf_bench_flows_traced") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("traced")
        )
        store = await Store.open(settings, min_size=1, max_size=2)
        try:
            return await _runfleet_throughput(
                settings,
                store,
                flows=flows,
                workers=workers,
                concurrency=concurrency,
                flows_module=TRACED_MODULE,
                otel=True,
            )
        finally:
            await store.close()
            await drop_keys(servers.redis_url, settings.redis_prefix)


async def _fsync_rows(
    servers: Servers, *, flows: int, workers: int, concurrency: int, polling: float | None
) -> tuple[FsyncFlows, ...]:
    """Both systems on each durability target, each in scratch databases there."""
    found: list[FsyncFlows] = []
    async with targets(servers) as chosen:
        for target in chosen:
            theirs = None
            if polling is not None:
                theirs = await dbos_side.run(
                    target.admin_url,
                    flows=flows,
                    workers=workers,
                    concurrency=concurrency,
                    polling=polling,
                )
            async with scratch_database(target.admin_url, "rf_bench_flows_fsync") as url:
                await migrate(url)
                settings = Settings(
                    database_url=url,
                    redis_url=servers.redis_url,
                    redis_prefix=bench_prefix("flows-fsync"),
                )
                store = await Store.open(settings, min_size=1, max_size=2)
                try:
                    ours = await _runfleet_throughput(
                        settings, store, flows=flows, workers=workers, concurrency=concurrency
                    )
                finally:
                    await store.close()
                    await drop_keys(servers.redis_url, settings.redis_prefix)
            found.append(FsyncFlows(target, ours, theirs, polling))
    return tuple(found)


def table(result: FlowsBenchResult) -> Table:
    """The side-by-side table the ``flows`` command prints."""
    t = Table(
        title=f"flows: {result.flows} three-step flows, {result.workers} processes x "
        f"{result.concurrency} concurrent each side, same Postgres server"
    )
    for col in ("", "flows/s (first start -> last finish)", "wall incl. start-up", "ratio"):
        t.add_column(col, justify="left" if not col else "right")
    rf = result.runfleet
    t.add_row("runfleet", f"{rf.per_s:,.1f}", f"{rf.wall_per_s:,.1f}", "")
    for polling, th in result.dbos.items():
        t.add_row(
            f"DBOS, queue polling {polling:g} s",
            f"{th.per_s:,.1f}",
            f"{th.wall_per_s:,.1f}",
            f"{rf.per_s / th.per_s:.2f}x",
        )
    for row in result.fsync:
        t.add_row(
            f"runfleet, {row.target.label}",
            f"{row.runfleet.per_s:,.1f}",
            f"{row.runfleet.wall_per_s:,.1f}",
            "",
        )
        if row.dbos is not None and row.ratio is not None:
            t.add_row(
                f"DBOS, queue polling {row.polling:g} s, fsync {row.target.fsync}",
                f"{row.dbos.per_s:,.1f}",
                f"{row.dbos.wall_per_s:,.1f}",
                f"{row.ratio:.2f}x",
            )
    if result.traced is not None and result.tracing_cost is not None:
        t.add_row(
            "runfleet, RUNFLEET_OTEL on (SDK records every span; off is the first row)",
            f"{result.traced.per_s:,.1f}",
            f"{result.traced.wall_per_s:,.1f}",
            f"{result.tracing_cost:.2f}x of off",
        )
    for sleep in result.sleeps:
        j = sleep.as_json()
        t.add_row(
            f"1 s ctx.sleep, {sleep.mode}: late p50 / p99 / max",
            f"{j['late_p50_ms']:.0f} / {j['late_p99_ms']:.0f} / {j['late_max_ms']:.0f} ms",
            f"p99 sleep {j['sleep_p99_s']:.2f} s",
            "",
        )
    t.add_section()
    for name, (measured, met) in result.targets().items():
        t.add_row(f"target: {name}", measured, "", "[green]met[/]" if met else "[red]missed[/]")
    return t
