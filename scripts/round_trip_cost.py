"""What one `enqueue` then `wait()` round trip costs the machine, per run, by process.

Two worker processes (``bench.noop``) serve a scratch database; the producer shapes of
``bench/shapes.py`` run their round trips (``--threads`` threads sharing one sync
``Queue``, then ``--tasks`` asyncio tasks sharing one ``AsyncQueue``), ``--runs`` each.
Around each shape it reads the scratch database's transactions (``pg_stat_database``:
commits and rollbacks, producer and workers together) and the CPU time of the producer,
the two workers, every ``postgres`` process and ``redis-server``, and prints them per run
with the shape's rate and p50.

``--trees A B`` runs each checkout in a child process of its own (``PYTHONPATH``),
alternating A, B, A, B for ``--rounds``, so a loaded machine's drift falls on both::

    PYTHONPATH=. python scripts/round_trip_cost.py --trees /path/to/old . --rounds 2

Postgres and Redis: ``--database-url`` / ``--redis-url`` (default: the
``RUNFLEET_TEST_*`` variables).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import psycopg


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _named(prefix: str) -> list[int]:
    return [
        p.pid for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith(prefix)
    ]


async def _measure(database_url: str, redis_url: str, runs: int, threads: int, tasks: int) -> Any:
    from bench.servers import bench_prefix
    from bench.shapes import TRIP_QUEUE, Calls, Mode, _rf_tasked, _rf_threaded
    from runfleet.ops.bench.procs import runfleet_worker, wait_workers_started
    from runfleet.ops.bench.scratch import scratch_database
    from runfleet.store.config import Settings
    from runfleet.store.migrate import migrate

    async with scratch_database(database_url, "rf_trip_cost") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=redis_url, redis_prefix=bench_prefix("trip-cost")
        )
        procs = [
            runfleet_worker(settings, flows="bench.noop", queues=TRIP_QUEUE, concurrency=32)
            for _ in range(2)
        ]

        def transactions() -> int:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                    " WHERE datname = current_database()"
                ).fetchone()
            assert row is not None
            return int(row[0])

        def snapshot() -> dict[str, float]:
            return {
                "transactions": transactions(),
                "producer": _cpu([os.getpid()]),
                "workers": _cpu([p.pid for p in procs]),
                "postgres": _cpu(_named("postgres")),
                "redis": _cpu(_named("redis-server")),
            }

        shapes: dict[str, Callable[[], Awaitable[Calls]]] = {
            f"{threads} threads": lambda: asyncio.to_thread(
                _rf_threaded, settings, threads, runs, Mode.ROUND_TRIP
            ),
            f"{tasks} tasks": lambda: _rf_tasked(settings, tasks, runs, Mode.ROUND_TRIP),
        }
        found: dict[str, dict[str, float]] = {}
        try:
            await wait_workers_started(settings, procs, timeout=60)
            for label, shape in shapes.items():
                before = snapshot()
                calls = await shape()
                after = snapshot()
                per_run = {k: (after[k] - before[k]) / runs for k in before}
                found[label] = {
                    "runs_per_s": calls.per_s,
                    "p50_ms": statistics.median(calls.latencies_ms),
                    "transactions": per_run.pop("transactions"),
                    **{f"{k}_cpu_ms": v * 1000 for k, v in per_run.items()},
                }
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trees", nargs=2, metavar=("A", "B"))
    parser.add_argument("--database-url", default=os.environ.get("RUNFLEET_TEST_DATABASE_URL"))
    parser.add_argument("--redis-url", default=os.environ.get("RUNFLEET_TEST_REDIS_URL"))
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database_url or not args.redis_url:
        parser.error("--database-url and --redis-url (or RUNFLEET_TEST_* variables) needed")
    if not args.trees:
        found = asyncio.run(
            _measure(args.database_url, args.redis_url, args.runs, args.threads, args.tasks)
        )
        print(json.dumps(found) if args.json else json.dumps(found, indent=2))
        return
    for round_ in range(args.rounds):
        for tree in args.trees:
            argv = [sys.executable, __file__, "--json", "--runs", str(args.runs)]
            argv += ["--threads", str(args.threads), "--tasks", str(args.tasks)]
            argv += ["--database-url", args.database_url, "--redis-url", args.redis_url]
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            began = time.monotonic()
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            found = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"round {round_ + 1} {tree} ({time.monotonic() - began:.0f} s):")
            for label, figures in found.items():
                shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"  {label}: {shown}")


if __name__ == "__main__":
    main()
