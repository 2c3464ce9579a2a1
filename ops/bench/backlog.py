"""The backlog benchmark: how fast a standing backlog drains, by depth, beside rq and Celery.

For each depth, each system admits that many no-op jobs in bulk (runfleet ``enqueue_many``,
rq ``enqueue_many``, Celery ``apply_async`` on one producer connection), then two worker
processes start (runfleet: 2 processes; rq: 2 ``SimpleWorker``s in burst mode; Celery:
one prefork worker of 2 children, ``acks_late``). The **steady rate** is the runs
completed per second between 10 % and 100 % done, from each system's own completion
times (runfleet's journal in database time, rq's ``ended_at``, Celery's ``date_done``):
the start-up of the workers is left out, the tail is not. Runfleet also reports the
stream messages it wrote per run (both lanes' ``entries-added``: 1.0 when no wake was
duplicated), the claims that lost a race, and the churn on ``runfleet.runs`` (updates,
HOT updates, dead tuples left; see docs/backlog.md).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from rich.table import Table

from runfleet.broker.client import connect
from runfleet.broker.streams import Lane, Streams
from runfleet.ops.bench.drain import admit, drop_keys, journal_tail
from runfleet.ops.bench.fleet_procs import Proc, Servers, bench_prefix, python_env, runfleet_worker
from runfleet.ops.bench.noop import QUEUE, noop
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q

FLOWS_MODULE = "runfleet.ops.bench.noop"
DEFAULT_DEPTHS = (1000, 10_000, 100_000)
SYSTEMS = ("runfleet", "rq", "celery")


@dataclass(frozen=True, slots=True)
class Drained:
    """One system's drain of one backlog."""

    system: str
    depth: int
    admit_s: float
    steady_per_s: float
    wall_s: float
    extra: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "depth": self.depth,
            "admit_s": round(self.admit_s, 2),
            "steady_runs_per_s": round(self.steady_per_s, 1),
            "wall_s": round(self.wall_s, 2),
            **self.extra,
        }


def steady_rate(done_ms: Sequence[float]) -> float:
    """Completions per second from the 10th percentile completion to the last.

    The 10th percentile is the first time by which 10 % were done (``percentile_disc``),
    and the rate counts the completions after it: the same rule as ``bench.backlog_rate``.
    """
    times = sorted(done_ms)
    if len(times) < 2:
        raise BenchError("a drain needs at least two completions to have a rate")
    first = math.ceil(0.1 * len(times)) - 1
    return _rate(len(times) - 1 - first, times[-1] - times[first])


def _rate(count: int, span_ms: float) -> float:
    return count / (span_ms / 1000) if span_ms > 0 else float("inf")


@dataclass(frozen=True)
class BacklogResult:
    depths: tuple[int, ...]
    workers: int
    concurrency: int
    rows: tuple[Drained, ...]
    load_before: tuple[float, float, float]

    def of(self, system: str, depth: int) -> Drained | None:
        return next((r for r in self.rows if r.system == system and r.depth == depth), None)

    def targets(self) -> dict[str, tuple[str, bool]]:
        found: dict[str, tuple[str, bool]] = {}
        low, high = self.of("runfleet", self.depths[0]), self.of("runfleet", self.depths[-1])
        if low and high and len(self.depths) > 1:
            kept = high.steady_per_s / low.steady_per_s
            found[
                f"runfleet at {self.depths[-1]:,} within 10% of its rate at {self.depths[0]:,}"
            ] = (f"{kept:.2f}x", kept >= 0.9)
        for depth in self.depths:
            rf, celery = self.of("runfleet", depth), self.of("celery", depth)
            if rf and celery:
                ratio = rf.steady_per_s / celery.steady_per_s
                found[f">= 2x Celery at {depth:,}"] = (f"{ratio:.2f}x", ratio >= 2)
            if rf:
                per_run = rf.extra["messages_per_run"]
                found[f"stream messages per run 1.0 at {depth:,}"] = (
                    f"{per_run:.3f}",
                    per_run <= 1.0,
                )
        return found

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": "backlog",
            "depths": list(self.depths),
            "workers": self.workers,
            "concurrency": self.concurrency,
            "load_average_before": list(self.load_before),
            "drains": [r.as_json() for r in self.rows],
            "targets": {k: {"measured": v[0], "met": v[1]} for k, v in self.targets().items()},
        }


async def run(
    servers: Servers,
    *,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    workers: int = 2,
    concurrency: int = 64,
    systems: Sequence[str] = SYSTEMS,
    timeout: float = 1800,
) -> BacklogResult:
    """Every depth, every system, one after another (same order at each depth)."""
    if not depths or any(d < 10 for d in depths) or workers < 1 or concurrency < 1:
        raise BenchError("depths must be >= 10 each, workers and concurrency >= 1")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise BenchError(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    load = _loadavg()
    rows: list[Drained] = []
    async with scratch_database(servers.database_url, "rf_bench_backlog") as url:
        await migrate(url)
        for depth in depths:
            for system in systems:
                if system == "rq":
                    rows.append(
                        await asyncio.to_thread(rq_drain, servers.redis_url, depth, workers)
                    )
                elif system == "celery":
                    rows.append(
                        await asyncio.to_thread(
                            celery_drain, servers.redis_url, depth, workers, timeout
                        )
                    )
                else:
                    rows.append(
                        await runfleet_drain(url, servers.redis_url, depth, workers, concurrency)
                    )
                print(json.dumps(rows[-1].as_json()), file=sys.stderr)
    return BacklogResult(tuple(depths), workers, concurrency, tuple(rows), load)


def _loadavg() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


# ---- runfleet --------------------------------------------------------------------------


async def _one(conn: psycopg.AsyncConnection[dict[str, Any]], name: str, **params: Any) -> Any:
    row = await (await conn.execute(q(name), params)).fetchone()
    assert row is not None
    return row


async def runfleet_drain(
    url: str, redis_url: str, depth: int, workers: int, concurrency: int, timeout: float = 1800
) -> Drained:
    settings = Settings(
        database_url=url, redis_url=redis_url, redis_prefix=bench_prefix(f"backlog{depth}")
    )
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        after = await journal_tail(conn)
        churn_before = await _one(conn, "bench.runs_churn")
        began = time.perf_counter()
        await admit(settings, depth)
        admitted = time.perf_counter()
        procs = [
            runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
            for _ in range(workers)
        ]
        try:
            deadline = time.monotonic() + timeout
            while int((await _one(conn, "bench.backlog_unsettled"))["unsettled"]) > 0:
                for proc in procs:
                    if proc.proc.poll() is not None:
                        raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")
                if time.monotonic() > deadline:
                    raise BenchError(f"runfleet: backlog of {depth} not drained in {timeout} s")
                await asyncio.sleep(0.5)
            wall = time.perf_counter() - admitted
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
        rate = await _one(conn, "bench.backlog_rate", after_seq=after)
        churn = await _one(conn, "bench.runs_churn")
        redis = connect(settings)
        try:
            streams = Streams(redis, settings.redis_prefix)
            written = 0
            for lane in Lane:
                info = await redis.xinfo_stream(streams.stream_key(QUEUE, lane))
                written += int(info["entries-added"])
        finally:
            await redis.aclose()
        await drop_keys(redis_url, settings.redis_prefix)
    settled = int(rate["settled"])
    if settled != depth:
        raise BenchError(f"runfleet settled {settled} of {depth}")
    span_ms = int(rate["last_ms"]) - int(rate["p10_ms"])
    updates = int(churn["n_tup_upd"]) - int(churn_before["n_tup_upd"])
    hot = int(churn["n_tup_hot_upd"]) - int(churn_before["n_tup_hot_upd"])
    return Drained(
        "runfleet",
        depth,
        admitted - began,
        _rate(depth - math.ceil(0.1 * depth), span_ms),
        wall,
        {
            "messages_per_run": round(written / depth, 4),
            "claim_lost": int(rate["claim_lost"]),
            "updates_per_run": round(updates / depth, 2),
            "hot_updates_per_run": round(hot / depth, 2),
            "dead_tuples_after": int(churn["n_dead_tup"]),
            "autovacuums": int(churn["autovacuum_count"]) - int(churn_before["autovacuum_count"]),
        },
    )


# ---- rq --------------------------------------------------------------------------------


def rq_drain(redis_url: str, depth: int, workers: int) -> Drained:
    """``depth`` jobs by ``enqueue_many`` (1,000 a call), drained by burst SimpleWorkers."""
    import redis
    from rq import Queue
    from rq.job import Job

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = Queue(name, connection=conn)
    try:
        began = time.perf_counter()
        ids: list[str] = []
        for start in range(0, depth, 1000):
            batch = [Queue.prepare_data(noop) for _ in range(min(1000, depth - start))]
            ids += [job.id for job in queue.enqueue_many(batch)]
        admitted = time.perf_counter()
        argv = [
            sys.executable, "-m", "rq.cli", "worker", "--worker-class", "rq.SimpleWorker",
            "--url", redis_url, "--logging_level", "WARNING", "--disable-job-desc-logging",
            "--burst", name,
        ]  # fmt: skip
        procs = [Proc(argv, python_env()) for _ in range(workers)]
        try:
            for proc in procs:
                if proc.proc.wait(3600) != 0:
                    raise BenchError(f"rq worker exited {proc.proc.returncode}:\n{proc.tail()}")
        finally:
            for proc in procs:
                proc.close()
        wall = time.perf_counter() - admitted
        ended: list[float] = []
        for start in range(0, len(ids), 1000):
            for job in Job.fetch_many(ids[start : start + 1000], connection=conn):
                if job is not None and job.ended_at is not None:
                    ended.append(_epoch_ms(job.ended_at))
        if len(ended) != depth:
            raise BenchError(f"rq finished {len(ended)} of {depth} jobs")
        return Drained("rq", depth, admitted - began, steady_rate(ended), wall)
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
        queue.delete(delete_jobs=True)
        conn.close()


def _epoch_ms(when: datetime) -> float:
    return when.timestamp() * 1000


# ---- Celery ----------------------------------------------------------------------------


def celery_drain(redis_url: str, depth: int, workers: int, timeout: float) -> Drained:
    """``depth`` tasks sent on one producer connection, then one prefork worker of
    ``workers`` children (late acks) drains them; completion times from the results."""
    import redis

    from runfleet.ops.bench.celery_app import TASK, make_app

    token = secrets.token_hex(4)
    env = {
        "RF_CELERY_REDIS": redis_url,
        "RF_CELERY_QUEUE": f"rf-bench-celery-{token}",
        "RF_CELERY_PREFIX": f"rf-bench-celery-{token}:",
    }
    app = make_app(redis_url, env["RF_CELERY_QUEUE"], env["RF_CELERY_PREFIX"])
    conn = redis.Redis.from_url(redis_url)
    try:
        began = time.perf_counter()
        ids: list[str] = []
        with app.producer_or_acquire() as producer:
            for _ in range(depth):
                ids.append(app.send_task(TASK, producer=producer).id)
        admitted = time.perf_counter()
        argv = [
            sys.executable, "-m", "celery", "-A", "runfleet.ops.bench.celery_app", "worker",
            "--pool", "prefork", "--concurrency", str(workers), "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--queues", env["RF_CELERY_QUEUE"],
        ]  # fmt: skip
        proc = Proc(argv, python_env(env))
        try:
            done = _celery_wait(conn, env["RF_CELERY_PREFIX"], ids, proc, timeout)
        finally:
            proc.terminate()
            proc.close()
        wall = time.perf_counter() - admitted
        return Drained("celery", depth, admitted - began, steady_rate(done), wall)
    finally:
        keys = list(conn.scan_iter(match=f"{env['RF_CELERY_PREFIX']}*", count=1000))
        for start in range(0, len(keys), 1000):
            conn.delete(*keys[start : start + 1000])
        conn.close()


def _celery_wait(conn: Any, prefix: str, ids: list[str], proc: Proc, timeout: float) -> list[float]:
    """Until every task has a stored result; their completion times (epoch ms)."""
    keys = [f"{prefix}celery-task-meta-{task_id}" for task_id in ids]
    deadline = time.monotonic() + timeout
    done: dict[int, float] = {}
    while True:
        missing = [i for i in range(len(keys)) if i not in done]
        for start in range(0, len(missing), 1000):
            chunk = missing[start : start + 1000]
            for i, raw in zip(chunk, conn.mget([keys[i] for i in chunk]), strict=True):
                if raw is not None:
                    meta = json.loads(raw)
                    if meta.get("status") != "SUCCESS":
                        raise BenchError(f"celery task {ids[i]}: {meta.get('status')}")
                    done[i] = _epoch_ms(datetime.fromisoformat(meta["date_done"]))
        if len(done) == len(keys):
            return list(done.values())
        if proc.proc.poll() is not None:
            raise BenchError(f"celery worker exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"celery: {len(done)}/{len(keys)} done in {timeout} s")
        time.sleep(1.0)


# ---- output ----------------------------------------------------------------------------


def table(result: BacklogResult) -> Table:
    out = Table(
        title=f"backlog drain, runs/s from 10% to 100% done ({result.workers} worker "
        f"processes each; load before {result.load_before[0]:.1f})"
    )
    out.add_column("pending at start", justify="right")
    for system in SYSTEMS:
        out.add_column(system, justify="right")
    out.add_column("runfleet / Celery", justify="right")
    out.add_column("messages / run", justify="right")
    out.add_column("claim-lost", justify="right")
    out.add_column("updates (HOT) / run", justify="right")
    for depth in result.depths:
        cells = []
        for system in SYSTEMS:
            row = result.of(system, depth)
            cells.append(f"{row.steady_per_s:,.0f}" if row else "—")
        rf, celery = result.of("runfleet", depth), result.of("celery", depth)
        ratio = f"{rf.steady_per_s / celery.steady_per_s:.2f}x" if rf and celery else "—"
        msgs = f"{rf.extra['messages_per_run']:.3f}" if rf else "—"
        lost = f"{rf.extra['claim_lost']:,.0f}" if rf else "—"
        upd = (
            f"{rf.extra['updates_per_run']:.1f} ({rf.extra['hot_updates_per_run']:.1f})"
            if rf
            else "—"
        )
        out.add_row(f"{depth:,}", *cells, ratio, msgs, lost, upd)
    for name, (measured, met) in result.targets().items():
        out.add_row(name, measured, "met" if met else "NOT met", *[""] * 6)
    return out
