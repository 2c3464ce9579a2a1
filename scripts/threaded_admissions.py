"""What threads sharing one sync ``Queue`` cost per admission, round after round.

``--threads`` threads share one ``Queue`` and call ``enqueue`` (a no-op flow, no worker)
``--runs`` times a round, for ``--rounds`` rounds on one scratch database, so each round
admits beside the runs and records of the rounds before it (a young database growing, as
a fleet's first minutes are). Each round prints its rate, the producer's and every
``postgres`` process's CPU per run, and the runs per statement (``ThreadGroupCommit``'s
flushes). A round slower than the one before, with Postgres's CPU per run growing, is a
plan that reads the grown tables.

``--trees A B`` runs each checkout in a child process of its own (``PYTHONPATH``),
alternating A, B, A, B for ``--alternations``::

    PYTHONPATH=. python scripts/threaded_admissions.py --trees /path/to/old . --alternations 2

Postgres and Redis: ``--database-url`` / ``--redis-url`` (default: the
``RUNFLEET_TEST_*`` variables).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import psutil
from round_trip_cost import _cpu, _named  # this script's own directory: scripts/


async def _measure(
    database_url: str, redis_url: str, runs: int, threads: int, rounds: int
) -> list[dict[str, float]]:
    from bench.noop import noop_flow
    from bench.servers import bench_prefix
    from bench.shapes import threaded
    from runfleet.ops.bench.scratch import scratch_database
    from runfleet.rqface import Queue
    from runfleet.store.config import Settings
    from runfleet.store.migrate import migrate

    me = psutil.Process()
    found: list[dict[str, float]] = []
    async with scratch_database(database_url, "rf_thread_admit") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=redis_url, redis_prefix=bench_prefix("thread-admit")
        )
        with Queue("thread-admissions", settings=settings) as queue:
            queue.enqueue(noop_flow)  # connect untimed
            groups = queue._inline.queue()._thread_groups.values()
            for _ in range(rounds):
                flushes = sum(g.flushes for g in groups)
                producer, postgres = sum(me.cpu_times()[:2]), _cpu(_named("postgres"))
                calls = await asyncio.to_thread(
                    threaded, threads, runs, lambda: queue.enqueue(noop_flow)
                )
                found.append(
                    {
                        "runs_per_s": calls.per_s,
                        "producer_cpu_us": (sum(me.cpu_times()[:2]) - producer) / runs * 1e6,
                        "postgres_cpu_us": (_cpu(_named("postgres")) - postgres) / runs * 1e6,
                        "runs_per_flush": runs / max(1, sum(g.flushes for g in groups) - flushes),
                    }
                )
    return found


def _show(found: list[dict[str, Any]]) -> None:
    for i, figures in enumerate(found, 1):
        print(
            f"  round {i}: {figures['runs_per_s']:,.0f} runs/s, producer "
            f"{figures['producer_cpu_us']:.0f} us a run, postgres "
            f"{figures['postgres_cpu_us']:.0f} us a run, {figures['runs_per_flush']:.1f} "
            "runs a statement"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alternations", type=int, default=2)
    parser.add_argument("--trees", nargs=2, metavar=("A", "B"))
    parser.add_argument("--database-url", default=os.environ.get("RUNFLEET_TEST_DATABASE_URL"))
    parser.add_argument("--redis-url", default=os.environ.get("RUNFLEET_TEST_REDIS_URL"))
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database_url or not args.redis_url:
        parser.error("--database-url and --redis-url (or RUNFLEET_TEST_* variables) needed")
    if not args.trees:
        found = asyncio.run(
            _measure(args.database_url, args.redis_url, args.runs, args.threads, args.rounds)
        )
        if args.json:
            print(json.dumps(found))
        else:
            _show(found)
        return
    for alternation in range(args.alternations):
        for tree in args.trees:
            argv = [sys.executable, __file__, "--json", "--runs", str(args.runs)]
            argv += ["--threads", str(args.threads), "--rounds", str(args.rounds)]
            argv += ["--database-url", args.database_url, "--redis-url", args.redis_url]
            # The script's own directory comes first on a child's path, never a checkout:
            # PYTHONPATH decides which tree's runfleet it imports.
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            print(f"alternation {alternation + 1}, {tree}:")
            _show(json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
