"""The runfleet side of the fleet benchmark: admission, drain and idle start latency.

Everything is read back from the database: a drain is over when every run's row says
``completed``; its processing window runs from the first ``claimed-and-activated``
record to the last ``transitioned`` one, and a start latency is a run's ``created_at_ms``
to its activation record — database time on both ends, so no host clock is trusted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from bench.figures import rate
from bench.noop import QUEUE, noop_flow
from bench.rq_side import Drain, SideResult
from runfleet.ops.bench.procs import Proc, runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError
from runfleet.producer import EnqueueSpec
from runfleet.rqface import Queue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus

FLOWS_MODULE = "bench.noop"


def _enqueue_phases(settings: Settings, runs: int) -> tuple[float, float, list[str]]:
    """Admit ``runs`` one call each, then ``runs`` in one ``enqueue_many``: two rates."""
    with Queue(QUEUE, settings=settings) as queue:
        queue.enqueue(noop_flow)  # connect (pool, Redis) outside the timed part
        began = time.perf_counter()
        ids = [queue.enqueue(noop_flow).id for _ in range(runs)]
        single = rate(runs, time.perf_counter() - began)
        specs = [EnqueueSpec(noop_flow) for _ in range(runs)]
        began = time.perf_counter()
        ids += [run.id for run in queue.enqueue_many(specs)]
        many = rate(runs, time.perf_counter() - began)
    return single, many, ids


def _enqueue_spaced(settings: Settings, count: int, gap_s: float) -> list[str]:
    """Admit ``count`` runs one at a time, ``gap_s`` apart, on an otherwise idle fleet."""
    ids: list[str] = []
    with Queue(QUEUE, settings=settings) as queue:
        queue.enqueue(noop_flow)  # warm the producer's connections
        for _ in range(count):
            ids.append(queue.enqueue(noop_flow).id)
            time.sleep(gap_s)
    return ids


async def wait_completed(
    store: Store, flow: str, total: int, procs: Sequence[Proc], timeout: float
) -> None:
    """Until ``total`` runs of ``flow`` are completed; any other terminal status fails."""
    deadline = time.monotonic() + timeout
    while True:
        counts = await store.stats.status_counts(flow=flow)
        bad = counts[RunStatus.FAILED] + counts[RunStatus.CANCELLED]
        if bad:
            raise BenchError(f"{bad} runs of {flow} failed or were cancelled")
        if counts[RunStatus.COMPLETED] >= total:
            return
        for proc in procs:
            if proc.proc.poll() is not None:
                raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"{flow}: {counts[RunStatus.COMPLETED]}/{total} done in {timeout}s")
        await asyncio.sleep(0.02)


async def _window_s(store: Store, after_seq: int) -> tuple[float, int]:
    """First activation to last settlement since ``after_seq``; and the last seq seen."""
    starts = await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED, after_seq=after_seq)
    ends = await store.stats.records_of_kind(Kind.TRANSITIONED, after_seq=after_seq)
    if not starts or not ends:
        raise BenchError("the journal has no activation or settlement records")
    last_seq = max(r.seq for r in [*starts, *ends])
    return (max(r.at_ms for r in ends) - min(r.at_ms for r in starts)) / 1000, last_seq


async def run(
    settings: Settings,
    *,
    runs: int,
    workers: int,
    concurrency: int,
    latency_samples: int,
    gap_s: float,
) -> SideResult:
    """Admission rates, a drain of 2 x ``runs`` by ``workers`` processes, idle latency."""
    store = await Store.open(settings, min_size=1, max_size=2)
    procs: list[Proc] = []
    try:
        single, many, ids = await asyncio.to_thread(_enqueue_phases, settings, runs)
        total = len(ids) + 1  # and the connection warm-up run
        began = time.perf_counter()
        procs = [
            runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
            for _ in range(workers)
        ]
        await wait_completed(store, noop_flow.name, total, procs, timeout=600)
        wall = time.perf_counter() - began
        window, seq = await _window_s(store, 0)
        twice = await store.stats.settled_more_than_once()
        if twice:
            raise BenchError(f"{len(twice)} runs settled more than once")
        drain = Drain(total, wall, window)
        await wait_workers_started(settings, procs, timeout=30)
        latency = await _latency(store, settings, procs, total, latency_samples, gap_s, seq)
        return SideResult(single, many, drain, latency)
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
        await store.close()


async def _latency(
    store: Store,
    settings: Settings,
    procs: Sequence[Proc],
    done: int,
    samples: int,
    gap_s: float,
    after_seq: int,
) -> tuple[float, ...]:
    """``created_at_ms`` to the ``claimed-and-activated`` record, one run at a time."""
    ids = await asyncio.to_thread(_enqueue_spaced, settings, samples, gap_s)
    await wait_completed(store, noop_flow.name, done + samples + 1, procs, timeout=120)
    rows = {row.id: row for row in await store.runs.get_many(ids)}
    records = await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED, after_seq=after_seq)
    activated = {r.run_id: r.at_ms for r in records}
    missing = [run_id for run_id in ids if run_id not in activated]
    if missing:
        raise BenchError(f"{len(missing)} latency runs have no activation record")
    return tuple(float(activated[i] - rows[i].created_at_ms) for i in ids)
