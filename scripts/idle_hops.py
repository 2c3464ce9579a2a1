"""Where an idle start's milliseconds go, hop by hop, and two checkouts side by side.

Two idle worker processes (``--flows idle_probe``, ``scripts/idle_probe.py``) serve one
queue; one thread enqueues a no-op run through the synchronous ``Queue``, waits ``--gap``
seconds, and again, ``--samples`` times. Every hop is stamped with CLOCK_MONOTONIC
(``time.monotonic_ns``), shared by the processes of one host:

- ``enqueue``: ``enqueue`` called -> returned (its admission committed);
- ``admit``: ``enqueue`` called -> its wake's ``XADD`` written;
- ``wake``: the ``XADD`` written -> the worker's doorbell ``XREAD`` answered;
- ``read``: the doorbell -> the group read's script answered;
- ``to_claim``: -> the claim statement sent; ``claim``: the statement and its commit
  (``claim.getconn``: the pool's checkout; ``claim.statement``: the statement's own
  round trip, commit included);
- ``returned_to_claimed``: ``enqueue`` returned -> the claim answered;
- ``to_body``: the claim answered -> the body's first line;
- ``start``: ``enqueue`` called -> the body's first line (the user's figure);
- ``xadd_to_body``: the ``XADD`` written -> the body's first line;
- ``probes``: pool health probes (an empty query) inside the claim, per run;
- ``pg_commit`` / ``pg_round_trip``: the machine's floor, after the same gap: a one-row
  insert with its commit, and ``SELECT 1``.

``--trees A B`` runs each checkout in a child process of its own (``PYTHONPATH``),
alternating A, B, A, B for ``--rounds``, so a loaded machine's drift falls on both::

    PYTHONPATH=. python scripts/idle_hops.py --trees /path/to/old /path/to/new --rounds 4

Postgres and Redis: ``--database-url`` / ``--redis-url`` (default: the
``RUNFLEET_TEST_*`` variables); a scratch database is created and dropped per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HOPS = (
    "enqueue", "admit", "wake", "read", "to_claim", "claim", "claim.getconn",
    "claim.statement", "returned_to_claimed",
    "to_body", "start", "xadd_to_body", "probes", "pg_commit", "pg_round_trip",
)  # fmt: skip


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _child(args: argparse.Namespace) -> dict[str, list[float]]:
    import secrets

    import idle_probe

    from runfleet.broker import blocking
    from runfleet.ops.bench.procs import runfleet_worker, wait_workers_started
    from runfleet.ops.bench.scratch import scratch_database
    from runfleet.rqface import Queue
    from runfleet.store.config import Settings
    from runfleet.store.migrate import migrate

    out = Path(os.environ["IDLE_PROBE_DIR"])
    sent: list[int] = []
    original = blocking.UnansweredXadds.send

    def send(self: Any, packed: Any, maxlen: int) -> None:
        original(self, packed, maxlen)
        if packed:
            sent.append(time.monotonic_ns())

    blocking.UnansweredXadds.send = send  # type: ignore[method-assign]  # the probe wraps it from outside
    async with scratch_database(args.database_url, "rf_idle_hops") as url:
        await migrate(url)
        if args.async_commit:
            import psycopg

            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    f"ALTER DATABASE {conn.info.dbname} SET synchronous_commit = off"
                )
        settings = Settings(
            database_url=url,
            redis_url=args.redis_url,
            redis_prefix=f"rf-idle-hops-{secrets.token_hex(4)}",
        )
        procs = [
            runfleet_worker(settings, flows="idle_probe", queues=idle_probe.QUEUE, concurrency=32)
            for _ in range(args.workers)
        ]
        try:
            await wait_workers_started(settings, procs, timeout=60)

            def drive() -> list[tuple[str, int, int, int]]:
                with Queue(idle_probe.QUEUE, settings=settings) as queue:
                    for run in [queue.enqueue(idle_probe.probe_noop) for _ in range(10)]:
                        run.wait(timeout=60)
                    time.sleep(0.5)
                    sent.clear()
                    calls: list[tuple[str, int, int, int]] = []
                    for _ in range(args.samples):
                        began = time.monotonic_ns()
                        run = queue.enqueue(idle_probe.probe_noop)
                        calls.append((run.id, began, sent[-1], time.monotonic_ns()))
                        time.sleep(args.gap)
                    for run_id, *_ in calls:
                        queue.fetch(run_id).wait(timeout=60)
                    return calls

            if args.threads:
                return await asyncio.to_thread(_loaded, settings, args, out)
            calls = await asyncio.to_thread(drive)
            await asyncio.sleep(0.2)
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
        floor = await asyncio.to_thread(_commits, url, args.samples, args.gap)
    return {**_hops(calls, out), **floor}


LOADED = (
    "enqueue", "to_body", "body_to_settled", "settled_to_returned", "settled_to_announced",
    "announced_to_noticed", "noticed_to_returned", "noticed", "round_trip", "rate",
)  # fmt: skip


def _loaded(settings: Any, args: argparse.Namespace, out: Path) -> dict[str, list[float]]:
    """``--threads`` threads share one ``Queue``, each enqueueing then waiting for its run,
    ``--samples`` times: where a loaded run's round trip goes."""
    import threading

    import idle_probe

    from runfleet.broker.notify import SettledWatch
    from runfleet.rqface import Queue

    noticed: dict[str, int] = {}
    watch_wait = SettledWatch.wait

    async def wait(self: Any, timeout: float) -> Any:
        notice = await watch_wait(self, timeout)
        if notice is not None:
            noticed.setdefault(notice.run_id, time.monotonic_ns())
        return notice

    SettledWatch.wait = wait  # type: ignore[method-assign]  # the probe wraps it from outside
    calls: list[tuple[str, int, int, int]] = []
    if args.tasks:
        wall = asyncio.run(_tasks(settings, args, calls))
    else:
        with Queue(idle_probe.QUEUE, settings=settings) as queue:
            for run in [queue.enqueue(idle_probe.probe_noop) for _ in range(20)]:
                run.wait(timeout=60)

            def loop() -> None:
                for _ in range(args.samples):
                    began = time.monotonic_ns()
                    run = queue.enqueue(idle_probe.probe_noop)
                    admitted = time.monotonic_ns()
                    run.wait(timeout=120)
                    calls.append((run.id, began, admitted, time.monotonic_ns()))

            threads = [threading.Thread(target=loop) for _ in range(args.threads)]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.monotonic() - began
    time.sleep(0.5)
    stamps: dict[tuple[str, str], int] = {}
    for path in out.glob("hops-*.txt"):
        for line in path.read_text().splitlines():
            t, _pid, event, *run = line.split(" ")
            if run:
                stamps.setdefault((event, run[0]), int(t))
    hops: dict[str, list[float]] = {h: [] for h in LOADED}
    hops["rate"].append(len(calls) / wall)
    ms = 1e-6
    for run_id, t0, t1, t2 in calls:
        hops["enqueue"].append((t1 - t0) * ms)
        hops["round_trip"].append((t2 - t0) * ms)
        body, settled = stamps.get(("body", run_id)), stamps.get(("settled", run_id))
        if body is None or settled is None:
            continue
        hops["to_body"].append((body - t1) * ms)
        hops["body_to_settled"].append((settled - body) * ms)
        hops["settled_to_returned"].append((t2 - settled) * ms)
        announced = stamps.get(("announce", run_id))
        if announced is not None:
            hops["settled_to_announced"].append((announced - settled) * ms)
            if run_id in noticed:
                hops["announced_to_noticed"].append((noticed[run_id] - announced) * ms)
                hops["noticed_to_returned"].append((t2 - noticed[run_id]) * ms)
        hops["noticed"].append(float(run_id in noticed))
    return hops


async def _tasks(
    settings: Any, args: argparse.Namespace, calls: list[tuple[str, int, int, int]]
) -> float:
    """``--tasks``: ``--threads`` asyncio tasks share one ``AsyncQueue`` instead."""
    import idle_probe

    from runfleet.producer import AsyncQueue

    async with AsyncQueue(idle_probe.QUEUE, settings=settings) as queue:
        for run in [await queue.enqueue(idle_probe.probe_noop) for _ in range(20)]:
            await run.wait(timeout=60)

        async def loop() -> None:
            for _ in range(args.samples):
                began = time.monotonic_ns()
                run = await queue.enqueue(idle_probe.probe_noop)
                admitted = time.monotonic_ns()
                await run.wait(timeout=120)
                calls.append((run.id, began, admitted, time.monotonic_ns()))

        began = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(args.threads)))
        return time.monotonic() - began


def _commits(url: str, samples: int, gap: float) -> dict[str, list[float]]:
    """The machine's floor beside the hops: a one-row insert and its commit (the two
    commits an idle start waits for), and an empty statement, after the same gap."""
    import psycopg

    out: dict[str, list[float]] = {"pg_commit": [], "pg_round_trip": []}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE idle_hops_floor (x integer)")
        for _ in range(samples):
            for name, sql in (
                ("pg_commit", "INSERT INTO idle_hops_floor VALUES (1)"),
                ("pg_round_trip", "SELECT 1"),
            ):
                time.sleep(gap)
                began = time.monotonic_ns()
                conn.execute(sql)
                out[name].append((time.monotonic_ns() - began) * 1e-6)
    return out


def _hops(calls: list[tuple[str, int, int, int]], out: Path) -> dict[str, list[float]]:
    events: list[tuple[int, int, str, str]] = []
    for path in out.glob("hops-*.txt"):
        for line in path.read_text().splitlines():
            t, pid, event, *run = line.split(" ")
            events.append((int(t), int(pid), event, run[0] if run else ""))
    events.sort()
    by_run: dict[tuple[str, str], tuple[int, int]] = {}
    for t, pid, event, run in events:
        if run:
            by_run.setdefault((event, run), (t, pid))
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    ms = 1e-6
    for run_id, began, xadd, returned in calls:
        body = by_run.get(("body", run_id))
        claim_sent = by_run.get(("claim_sent", run_id))
        claim_back = by_run.get(("claim_back", run_id))
        if body is None:
            continue
        hops["start"].append((body[0] - began) * ms)
        hops["xadd_to_body"].append((body[0] - xadd) * ms)
        hops["admit"].append((xadd - began) * ms)
        hops["enqueue"].append((returned - began) * ms)
        if claim_sent is None or claim_back is None or claim_sent[1] != body[1]:
            continue
        pid = body[1]

        def last(event: str, before: int, pid: int = pid, after: int = xadd) -> int | None:
            found = [t for t, p, e, _ in events if p == pid and e == event and after <= t <= before]
            return found[-1] if found else None

        script = last("script", claim_sent[0])
        doorbell = last("doorbell", script if script is not None else claim_sent[0])
        if doorbell is not None:
            hops["wake"].append((doorbell - xadd) * ms)
            if script is not None:
                hops["read"].append((script - doorbell) * ms)
        step = script if script is not None else doorbell
        if step is not None:
            hops["to_claim"].append((claim_sent[0] - step) * ms)
        hops["claim"].append((claim_back[0] - claim_sent[0]) * ms)
        hops["returned_to_claimed"].append((claim_back[0] - returned) * ms)
        inside = [
            (t, e) for t, p, e, _ in events if p == pid and claim_sent[0] <= t <= claim_back[0]
        ]
        got = [t for t, e in inside if e == "getconn"]
        sent_at = [t for t, e in inside if e == "pg_sent"]
        back = [t for t, e in inside if e == "pg_back"]
        if got:
            hops["claim.getconn"].append((got[0] - claim_sent[0]) * ms)
        if sent_at and back:
            hops["claim.statement"].append((back[-1] - sent_at[-1]) * ms)
        hops["probes"].append(float(sum(1 for _, e in inside if e == "pg_probe")))
        hops["to_body"].append((body[0] - claim_back[0]) * ms)
    return hops


def _parent(args: argparse.Namespace) -> None:
    names = LOADED if args.threads else HOPS
    found: dict[str, dict[str, list[float]]] = {tree: {h: [] for h in names} for tree in args.trees}
    for round_ in range(args.rounds):
        for tree in args.trees:
            with tempfile.TemporaryDirectory(prefix="idle-hops-") as probe_dir:
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join([tree, str(HERE)])
                env["IDLE_PROBE_DIR"] = probe_dir
                argv = [
                    sys.executable, str(HERE / "idle_hops.py"), "--child",
                    "--samples", str(args.samples), "--gap", str(args.gap),
                    "--workers", str(args.workers), "--threads", str(args.threads),
                    *(["--tasks"] if args.tasks else []),
                    *(["--async-commit"] if args.async_commit else []),
                    "--database-url", args.database_url, "--redis-url", args.redis_url,
                ]  # fmt: skip
                done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tree)
                if done.returncode != 0:
                    sys.exit(f"{tree}: round {round_} failed:\n{done.stderr[-3000:]}")
                hops = json.loads(done.stdout.strip().splitlines()[-1])
                start = hops["round_trip" if args.threads else "start"]
                load = os.getloadavg()[0]
                print(
                    f"round {round_} {tree}: start p50 {_pct(start, 50):.2f} ms"
                    f" p99 {_pct(start, 99):.2f} ms (n={len(start)}, load {load:.1f})",
                    flush=True,
                )
                for h in names:
                    found[tree][h] += hops[h]
    print(f"\n{'hop (ms)':<14}" + "".join(f"{Path(t).name + ' p50/p99':>26}" for t in args.trees))
    for h in names:
        row = f"{h:<14}"
        for tree in args.trees:
            v = found[tree][h]
            row += f"{_pct(v, 50):>17.2f} /{_pct(v, 99):>7.2f}"
        print(row)
    if args.json:
        print(json.dumps({t: {h: statistics.median(v) if v else None for h, v in hops.items()}
                          for t, hops in found.items()}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=[str(HERE.parent)])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between enqueues")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="loaded: this many threads share one Queue, each enqueueing then waiting,"
        " --samples runs each (0: the idle start)",
    )
    parser.add_argument("--database-url", default=os.environ.get("RUNFLEET_TEST_DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("RUNFLEET_TEST_REDIS_URL", ""))
    parser.add_argument(
        "--tasks", action="store_true", help="--threads asyncio tasks sharing one AsyncQueue"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="diagnosis only: synchronous_commit off, to see the path without its fsyncs",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args))))
    else:
        _parent(args)


if __name__ == "__main__":
    main()
