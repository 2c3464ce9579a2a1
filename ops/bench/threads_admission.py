"""Threads sharing one sync ``Queue``: admissions/s beside rq's threads on one Redis pool.

A threaded service (a WSGI server's request threads, say) shares one ``Queue``; each
thread enqueues one run per request. Measured here: ``--threads`` threads each calling
``enqueue`` in a loop on one shared ``Queue`` (every run durable before its call returns),
the same threads on one shared rq ``Queue`` (one Redis connection pool), and one thread's
single ``enqueue`` on each side. Rounds alternate the sides; each figure is the median of
its rounds. No workers run: only admission is timed. Scratch database and keys are dropped.

    python -m runfleet.ops.bench.threads_admission --threads 16 --runs 4000 --rounds 2

The database and Redis are ``RUNFLEET_BENCH_DATABASE_URL`` / ``RUNFLEET_BENCH_REDIS_URL``
(default: the local servers on their standard ports).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from runfleet.ops.bench.drain import drop_keys
from runfleet.ops.bench.fleet_procs import bench_prefix, rate
from runfleet.ops.bench.noop import noop, noop_flow
from runfleet.ops.bench.scratch import scratch_database
from runfleet.rqface import Queue
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate


def threaded(threads: int, runs: int, one: Callable[[], Any]) -> float:
    """``runs`` calls of ``one`` spread over ``threads`` threads started together; calls/s."""
    share = [runs // threads + (1 if i < runs % threads else 0) for i in range(threads)]
    gate = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def loop(n: int) -> None:
        gate.wait()
        try:
            for _ in range(n):
                one()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=loop, args=(n,)) for n in share]
    for worker in workers:
        worker.start()
    gate.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return rate(runs, elapsed)


def runfleet_side(settings: Settings, threads: int, runs: int) -> tuple[float, float]:
    with Queue("bench-threads", settings=settings) as queue:
        queue.enqueue(noop_flow)  # connect outside the timed part
        many = threaded(threads, runs, lambda: queue.enqueue(noop_flow))
        single = threaded(1, runs // 2, lambda: queue.enqueue(noop_flow))
    return many, single


def rq_side(redis_url: str, threads: int, runs: int) -> tuple[float, float]:
    import redis
    from rq import Queue as RqQueue

    conn = redis.Redis.from_url(redis_url)  # one connection pool, shared by the threads
    queue = RqQueue(f"rf-bench-rq-{secrets.token_hex(4)}", connection=conn)
    try:
        queue.enqueue(noop)
        many = threaded(threads, runs, lambda: queue.enqueue(noop))
        single = threaded(1, runs // 2, lambda: queue.enqueue(noop))
        return many, single
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
        queue.delete(delete_jobs=True)
        conn.close()


async def run(
    database_url: str, redis_url: str, *, threads: int, runs: int, rounds: int
) -> dict[str, float]:
    raw: dict[str, list[float]] = {}
    async with scratch_database(database_url, "rf_bench_threads") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=redis_url, redis_prefix=bench_prefix("threads")
        )
        try:
            for _ in range(rounds):
                many, single = await asyncio.to_thread(runfleet_side, settings, threads, runs)
                raw.setdefault("runfleet.threads", []).append(many)
                raw.setdefault("runfleet.single", []).append(single)
                many, single = await asyncio.to_thread(rq_side, redis_url, threads, runs)
                raw.setdefault("rq.threads", []).append(many)
                raw.setdefault("rq.single", []).append(single)
        finally:
            await drop_keys(redis_url, settings.redis_prefix)
    return {key: statistics.median(values) for key, values in raw.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    database_url = os.environ.get(
        "RUNFLEET_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    redis_url = os.environ.get("RUNFLEET_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    figures = asyncio.run(
        run(database_url, redis_url, threads=args.threads, runs=args.runs, rounds=args.rounds)
    )
    ratio = figures["runfleet.threads"] / figures["rq.threads"]
    print(
        f"{args.threads} threads sharing one Queue, admissions/s: "
        f"runfleet {figures['runfleet.threads']:,.0f}, rq {figures['rq.threads']:,.0f} "
        f"({ratio:.2f}x); one thread: runfleet {figures['runfleet.single']:,.0f}, "
        f"rq {figures['rq.single']:,.0f}; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
