"""A producer waiting on every result, and a worker's memory: runs in flight, long soak.

``wait()``: rq users enqueue and then wait for each job's result, and that traffic
shares the servers with the workers. Both sides start idle workers, then the producer
admits a backlog in one ``enqueue_many`` and waits for every run's result in turn
(runfleet: the sync ``Job.wait()``; rq: ``job.latest_result(timeout)``, its blocking
read): runs/s from admission to the last result. Then the same call on runs already
settled, one at a time, in ms (rq: ``job.return_value(refresh=True)``, a read of the
result it keeps in Redis).

In flight: one worker's resident set idle and with the plan's ``memory.runs`` naps
executing at once.

Soak (opt-in, the plan's ``soak``): one worker drains no-op runs in batches of 10,000 and
its resident set is read after each batch, while it is idle between batches; memory left
behind per run shows up as growth from the first sample (after the warm-up batch) to
the last.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import rq_side
from bench.drain import FLOWS_MODULE, admit, journal_tail, wait_settled
from bench.figures import percentile, rate, rss_mb
from bench.noop import QUEUE, nap, noop_flow
from runfleet.ops.bench.procs import runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings

SOAK_SAMPLE_EVERY = 10_000
SOAK_GROWTH_MB = 20.0
SOAK_GROWTH_SHARE = 0.10


@dataclass(frozen=True, slots=True)
class Results:
    """Both sides: drain rate with a producer waiting on every result; settled-read ms."""

    runs: int
    runfleet_per_s: float
    rq_per_s: float
    runfleet_ms: tuple[float, ...]
    rq_ms: tuple[float, ...]

    def as_json(self) -> dict[str, Any]:
        def ms(values: tuple[float, ...]) -> dict[str, float]:
            return {
                "samples": len(values),
                "p50_ms": round(percentile(values, 50), 3),
                "p99_ms": round(percentile(values, 99), 3),
            }

        return {
            "runs": self.runs,
            "runfleet_with_result_per_s": round(self.runfleet_per_s, 1),
            "rq_with_result_per_s": round(self.rq_per_s, 1),
            "runfleet_settled_result": ms(self.runfleet_ms),
            "rq_settled_return_value": ms(self.rq_ms),
        }


@dataclass(frozen=True, slots=True)
class Soak:
    """RSS (MiB) after each batch: (runs done, rss); the first is before any run."""

    runs: int
    samples: tuple[tuple[int, float], ...]

    @property
    def warm_mb(self) -> float:
        """After the first batch: the baseline growth is measured from."""
        return self.samples[1][1] if len(self.samples) > 1 else self.samples[0][1]

    @property
    def last_mb(self) -> float:
        return self.samples[-1][1]

    @property
    def max_mb(self) -> float:
        return max(mb for _, mb in self.samples)

    @property
    def growth_mb(self) -> float:
        return self.last_mb - self.warm_mb

    @property
    def flat(self) -> bool:
        return self.growth_mb < SOAK_GROWTH_MB or self.growth_mb < SOAK_GROWTH_SHARE * self.warm_mb

    def as_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "samples": [{"runs": n, "rss_mb": round(mb, 1)} for n, mb in self.samples],
            "warm_mb": round(self.warm_mb, 1),
            "last_mb": round(self.last_mb, 1),
            "max_mb": round(self.max_mb, 1),
            "growth_mb": round(self.growth_mb, 1),
        }


@dataclass(frozen=True, slots=True)
class Memory:
    """One worker's resident memory idle and with ``in_flight`` runs executing."""

    concurrency: int
    in_flight: int
    idle_mb: float
    loaded_mb: float
    peak_mb: float

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "in_flight": self.in_flight,
            "idle_rss_mb": round(self.idle_mb, 1),
            "rss_mb": round(self.loaded_mb, 1),
            "peak_rss_mb": round(self.peak_mb, 1),
        }


async def in_flight(settings: Settings, store: Store, *, concurrency: int, nap_s: float) -> Memory:
    """One worker, ``concurrency`` slots, as many naps: VmRSS once they are all in flight."""
    proc = runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
    try:
        await wait_workers_started(settings, [proc], timeout=30)
        await asyncio.sleep(0.5)
        idle = rss_mb(proc.pid)
        async with AsyncQueue(QUEUE, settings=settings) as queue:
            await queue.enqueue_many([EnqueueSpec(nap, (nap_s,))] * concurrency)
        in_flight, loaded = 0, 0.0
        deadline = time.monotonic() + nap_s
        while time.monotonic() < deadline:
            owned = await store.stats.running_by_owner()
            held = sum(n for o, n in owned.items() if o.pid == proc.pid)
            if held >= in_flight:
                in_flight, loaded = held, rss_mb(proc.pid)
            if held >= concurrency:
                break
            await asyncio.sleep(0.05)
        return Memory(concurrency, in_flight, idle, loaded, rss_mb(proc.pid, "VmHWM"))
    finally:
        proc.close()


def _runfleet_with_results(
    settings: Settings, runs: int, samples: int
) -> tuple[float, tuple[float, ...]]:
    with Queue(QUEUE, settings=settings) as queue:
        queue.enqueue(noop_flow).wait(timeout=60)  # connections, and a worker answering
        began = time.perf_counter()
        jobs = queue.enqueue_many([EnqueueSpec(noop_flow)] * runs)
        for job in jobs:
            job.wait(timeout=120)
        per_s = rate(runs, time.perf_counter() - began)
        latency: list[float] = []
        for job in jobs[:samples]:
            began = time.perf_counter()
            job.wait(timeout=5)
            latency.append((time.perf_counter() - began) * 1000)
    return per_s, tuple(latency)


async def results(
    settings: Settings,
    redis_url: str,
    *,
    runs: int,
    workers: int,
    concurrency: int,
    samples: int,
) -> Results:
    """rq first, then runfleet, each with ``workers`` idle processes started beforehand."""
    rq_per_s, rq_ms = await asyncio.to_thread(
        rq_side.with_results, redis_url, runs=runs, workers=workers, samples=samples
    )
    procs = [
        runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
        for _ in range(workers)
    ]
    try:
        await wait_workers_started(settings, procs, timeout=30)
        rf_per_s, rf_ms = await asyncio.to_thread(_runfleet_with_results, settings, runs, samples)
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
    return Results(runs, rf_per_s, rq_per_s, rf_ms, rq_ms)


async def soak(settings: Settings, *, runs: int, concurrency: int, timeout: float = 3600) -> Soak:
    """One worker, ``runs`` no-ops in batches of ``SOAK_SAMPLE_EVERY``: RSS after each."""
    if runs < 1:
        raise BenchError("soak runs must be >= 1")
    proc = runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
    try:
        await wait_workers_started(settings, [proc], timeout=30)
        samples = [(0, rss_mb(proc.pid))]
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            done = 0
            while done < runs:
                batch = min(SOAK_SAMPLE_EVERY, runs - done)
                after = await journal_tail(conn)
                await admit(settings, batch)
                await wait_settled(conn, after, batch, [proc], timeout)
                done += batch
                samples.append((done, rss_mb(proc.pid)))
        return Soak(runs, tuple(samples))
    finally:
        proc.terminate()
        proc.close()
