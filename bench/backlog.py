"""The backlog benchmark: how fast a standing backlog drains, by depth, beside rq and Celery.

For each depth, each system admits that many no-op jobs in bulk (runfleet ``enqueue_many``,
rq ``enqueue_many``, Celery ``apply_async`` on one producer connection), then two worker
processes start (runfleet: 2 processes; rq: 2 ``SimpleWorker``s in burst mode; Celery:
one prefork worker of 2 children, ``acks_late``). The **steady rate** is the runs
completed per second over the drain's steady window (``steady_window``), from each
system's own completion times and the process that completed each (runfleet's journal
in database time and its writer, rq's ``ended_at`` and ``worker_name``, Celery's
``date_done`` and the child's pid its task returns): from the later of 10 % done and
the first completion of the last worker process to start, to the last completion. So
no system's start-up is inside its window, whichever of its processes starts last:
the tail is. Runfleet's Postgres runs with its commits flushed to disk (the bench's own
throwaway with ``fsync``, ``synchronous_commit`` and ``full_page_writes`` on, or the
server ``--database-url`` names, as configured; the output says which). Runfleet also
reports the stream messages it wrote per run (both lanes' ``entries-added``: 1.0 when no
wake was duplicated), the claims that lost a race, the churn on ``runfleet.runs``
(updates, HOT updates, dead tuples left; see docs/explanation/backlogs.md) and what
each run cost the server (WAL records and bytes, WAL flushes, commits).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg.rows import dict_row
from rich.table import Table

from bench.drain import admit, drop_keys, journal_tail
from bench.durability import Target, durable
from bench.noop import QUEUE, noop
from bench.rq_side import RQ_WORKER
from bench.servers import Servers, bench_prefix
from runfleet.broker.client import connect
from runfleet.broker.streams import Lane, Streams
from runfleet.ops.bench.procs import Proc, python_env, runfleet_worker
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q

FLOWS_MODULE = "bench.noop"
DEFAULT_DEPTHS = (1000, 10_000, 100_000)
SYSTEMS = ("runfleet", "rq", "celery")


class WindowStart(StrEnum):
    """Where a drain's steady window starts (``steady_window``)."""

    TENTH = "10% done"
    """Every worker process had completed a run by then."""
    LAST_STARTED = "last process's first completion"
    """A process started after 10 % were done: the window waits for it."""
    TENTH_LATE = "10% done, a process started too late to wait for"
    """Nothing came after that process's first completion: the 10 % window, flagged."""


@dataclass(frozen=True, slots=True)
class Window:
    """The part of a drain its steady rate counts: ``runs`` completions after its first,
    over ``span_ms``, by ``processes`` worker processes."""

    runs: int
    span_ms: float
    processes: int
    starts: WindowStart

    @property
    def per_s(self) -> float:
        return _rate(self.runs, self.span_ms)

    def as_json(self) -> dict[str, Any]:
        return {
            "window_runs": self.runs,
            "window_s": round(self.span_ms / 1000, 3),
            "window_from": self.starts.value,
            "processes_seen": self.processes,
        }


@dataclass(frozen=True, slots=True)
class Drained:
    """One system's drain of one backlog."""

    system: str
    depth: int
    admit_s: float
    window: Window
    wall_s: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def steady_per_s(self) -> float:
        return self.window.per_s

    def as_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "depth": self.depth,
            "admit_s": round(self.admit_s, 2),
            "steady_runs_per_s": round(self.steady_per_s, 1),
            **self.window.as_json(),
            "wall_s": round(self.wall_s, 2),
            **self.extra,
        }


def steady_window(done: Sequence[tuple[str, float]]) -> Window:
    """The steady window of a drain's completions, each (process, completion time in ms).

    It runs from the later of the 10th percentile completion (the first time by which
    10 % were done, ``percentile_disc``) and the first completion of the process that
    started last, to the last completion, and counts the completions after its first.
    A worker process still starting is not part of the fleet's steady state: counting
    it would charge a system for its start-up exactly when one of its processes starts
    later than the others, as runfleet's second process often does on a loaded box
    (Celery's prefork children are forked before it consumes). If the last process
    started so late that nothing came after its first completion, the window is the 10 %
    one, flagged ``TENTH_LATE``.
    """
    times = sorted(t for _, t in done)
    if len(times) < 2:
        raise BenchError("a drain needs at least two completions to have a rate")
    first = math.ceil(0.1 * len(times)) - 1
    started: dict[str, float] = {}
    for process, t in done:
        started[process] = min(t, started.get(process, t))
    ready = bisect.bisect_left(times, max(started.values()))
    start, starts = (
        (first, WindowStart.TENTH) if ready <= first else (ready, WindowStart.LAST_STARTED)
    )
    if start >= len(times) - 1:
        start, starts = first, WindowStart.TENTH_LATE
    return Window(len(times) - 1 - start, times[-1] - times[start], len(started), starts)


def steady_rate(done_ms: Sequence[float]) -> float:
    """Completions per second from the 10th percentile completion to the last (one process:
    ``steady_window`` with nothing still starting)."""
    return steady_window([("", t) for t in done_ms]).per_s


def _rate(count: int, span_ms: float) -> float:
    return count / (span_ms / 1000) if span_ms > 0 else float("inf")


@dataclass(frozen=True)
class BacklogResult:
    depths: tuple[int, ...]
    workers: int
    concurrency: int
    rows: tuple[Drained, ...]
    load_before: tuple[float, float, float]
    server: Target | None = None
    """Runfleet's Postgres, with its durability settings as it reported them."""
    load_after: tuple[float, float, float] | None = None

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
            "load_average_after": list(self.load_after) if self.load_after else None,
            "postgres": self.server.as_json() if self.server else None,
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
    profile: bool = False,
) -> BacklogResult:
    """Every depth, every system, one after another (same order at each depth).

    ``profile``: preload ``pg_stat_statements`` on the bench's throwaway and report, per
    runfleet drain, its costliest statements (calls, ms and buffers per call) and the
    size of every index on ``runs`` before the admission and after the drain."""
    if not depths or any(d < 10 for d in depths) or workers < 1 or concurrency < 1:
        raise BenchError("depths must be >= 10 each, workers and concurrency >= 1")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise BenchError(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    load = os.getloadavg()
    rows: list[Drained] = []
    async with (
        durable(servers, PGSS if profile else None) as target,
        scratch_database(target.admin_url, "rf_bench_backlog") as url,
    ):
        print(f"runfleet's Postgres: {target.label}", file=sys.stderr)
        await migrate(url)
        if profile:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                preload = await (await conn.execute("SHOW shared_preload_libraries")).fetchone()
                if preload is None or "pg_stat_statements" not in str(preload[0]):
                    raise BenchError(
                        "--profile needs pg_stat_statements in the server's "
                        "shared_preload_libraries: the bench's own throwaway has it (leave "
                        "out --database-url); this server's list is "
                        f"{preload[0] if preload else ''!r}"
                    )
                await conn.execute(q("bench.capacity_extension"))
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
                        await runfleet_drain(
                            url, servers.redis_url, depth, workers, concurrency, profile=profile
                        )
                    )
                print(json.dumps(rows[-1].as_json()), file=sys.stderr)
    return BacklogResult(
        tuple(depths), workers, concurrency, tuple(rows), load, target, os.getloadavg()
    )


# ---- runfleet --------------------------------------------------------------------------


async def _one(conn: psycopg.AsyncConnection[dict[str, Any]], name: str, **params: Any) -> Any:
    row = await (await conn.execute(q(name), params)).fetchone()
    assert row is not None
    return row


async def _counters(conn: psycopg.AsyncConnection[dict[str, Any]], wait: float = 15.0) -> Any:
    """The server's counters once every other session on the database has gone (each
    reports its statistics as it exits: read earlier, a short drain's or the admission's
    last second would be missing or counted in the wrong phase), waiting ``wait`` s at most."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if int((await _one(conn, "bench.other_backends"))["n"]) == 0:
            break
        await asyncio.sleep(0.05)
    return await _one(conn, "bench.server_counters")


async def runfleet_drain(
    url: str,
    redis_url: str,
    depth: int,
    workers: int,
    concurrency: int,
    timeout: float = 1800,
    *,
    profile: bool = False,
) -> Drained:
    """Admit ``depth`` no-op runs, then drain them with ``workers`` fresh processes.

    The server's counters are read after the admission and after the drain: what the
    drain (claims, settlements, heartbeats, sweeps, this poll) cost it per run."""
    settings = Settings(
        database_url=url, redis_url=redis_url, redis_prefix=bench_prefix(f"backlog{depth}")
    )
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        after = await journal_tail(conn)
        churn_before = await _one(conn, "bench.runs_churn")
        pages_before = await _index_pages(conn) if profile else {}
        began = time.perf_counter()
        await admit(settings, depth)
        admitted = time.perf_counter()
        server_before = await _counters(conn)
        if profile:
            await conn.execute(q("bench.statements_reset"))
        procs = [
            runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE, concurrency=concurrency)
            for _ in range(workers)
        ]
        try:
            deadline = time.monotonic() + timeout
            while (await _one(conn, "bench.backlog_unsettled"))["unsettled"]:
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
        server = await _counters(conn)
        rate = await _one(conn, "bench.backlog_rate", after_seq=after)
        cur = await conn.execute(q("bench.backlog_settlements"), {"after_seq": after})
        done = [(str(r["source_id"]), float(r["at_ms"])) for r in await cur.fetchall()]
        churn = await _one(conn, "bench.runs_churn")
        profiled: dict[str, Any] = {}
        if profile:
            profiled = {
                "statements": await _statements(conn, depth),
                "index_pages": {
                    name: [pages_before.get(name, 0), pages]
                    for name, pages in (await _index_pages(conn)).items()
                },
            }
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
    cost = {k: int(server[k]) - int(server_before[k]) for k in server}
    updates = int(churn["n_tup_upd"]) - int(churn_before["n_tup_upd"])
    hot = int(churn["n_tup_hot_upd"]) - int(churn_before["n_tup_hot_upd"])
    return Drained(
        "runfleet",
        depth,
        admitted - began,
        steady_window(done),
        wall,
        {
            "messages_per_run": round(written / depth, 4),
            "claim_lost": int(rate["claim_lost"]),
            "updates_per_run": round(updates / depth, 2),
            "hot_updates_per_run": round(hot / depth, 2),
            "dead_tuples_after": int(churn["n_dead_tup"]),
            "autovacuums": int(churn["autovacuum_count"]) - int(churn_before["autovacuum_count"]),
            "wal_records_per_run": round(cost["wal_records"] / depth, 2),
            "wal_bytes_per_run": round(cost["wal_bytes"] / depth),
            "wal_flushes_per_run": round(cost["wal_sync"] / depth, 4),
            "commits_per_run": round(cost["xact_commit"] / depth, 4),
            **profiled,
        },
    )


PGSS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.max": "5000",
}


def statement_name(text: str) -> str:
    """The named SQL block (``store/sql``) a ``pg_stat_statements`` text came from: the
    block whose text before its first parameter starts the statement, longest first;
    else the statement's first line."""
    best, length = "", 0
    for name, body in _bodies():
        if len(body) > length and text.startswith(body):
            best, length = name, len(body)
    if best:
        return best
    code = [line for line in text.splitlines() if line.strip() and not line.startswith("--")]
    return " ".join((code[0] if code else text).split())[:80]


@functools.cache
def _bodies() -> tuple[tuple[str, str], ...]:
    from runfleet.store.queries import _all

    found = []
    for name, body in _all().items():
        head = body.split("%(", 1)[0].split("%s", 1)[0]
        if len(head) >= 20:
            found.append((name, head))
    return tuple(found)


async def _statements(conn: psycopg.AsyncConnection[dict[str, Any]], depth: int) -> list[Any]:
    """The drain's costliest statements (pg_stat_statements since the reset)."""
    cur = await conn.execute(q("bench.statements_profile"), {"top": 25})
    return [
        {
            "statement": statement_name(str(r["query"])),
            "calls": int(r["calls"]),
            "calls_per_run": round(int(r["calls"]) / depth, 4),
            "total_ms": round(float(r["total_exec_time"]), 1),
            "ms_per_call": round(float(r["mean_exec_time"]), 3),
            "ms_per_run": round(float(r["total_exec_time"]) / depth, 4),
            "buffers_per_call": round(float(r["buffers_per_call"]), 1),
            "reads_per_call": round(float(r["reads_per_call"]), 2),
            "rows_per_call": round(float(r["rows_per_call"]), 1),
        }
        for r in await cur.fetchall()
    ]


async def _index_pages(conn: psycopg.AsyncConnection[dict[str, Any]]) -> dict[str, int]:
    cur = await conn.execute(q("bench.runs_index_sizes"))
    return {str(r["index"]): int(r["pages"]) for r in await cur.fetchall()}


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
            sys.executable, "-m", "rq.cli", "worker", "--worker-class", RQ_WORKER,
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
        ended: list[tuple[str, float]] = []
        for start in range(0, len(ids), 1000):
            for job in Job.fetch_many(ids[start : start + 1000], connection=conn):
                if job is not None and job.ended_at is not None:
                    ended.append((job.worker_name or "", _epoch_ms(job.ended_at)))
        if len(ended) != depth:
            raise BenchError(f"rq finished {len(ended)} of {depth} jobs")
        return Drained("rq", depth, admitted - began, steady_window(ended), wall)
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

    from bench.celery_app import TASK, make_app

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
            sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
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
        return Drained("celery", depth, admitted - began, steady_window(done), wall)
    finally:
        keys = list(conn.scan_iter(match=f"{env['RF_CELERY_PREFIX']}*", count=1000))
        for start in range(0, len(keys), 1000):
            conn.delete(*keys[start : start + 1000])
        conn.close()


def _celery_wait(
    conn: Any, prefix: str, ids: list[str], proc: Proc, timeout: float
) -> list[tuple[str, float]]:
    """Until every task has a stored result; (child pid, completion time in epoch ms) of
    each (the no-op task returns the pid of the child that ran it)."""
    keys = [f"{prefix}celery-task-meta-{task_id}" for task_id in ids]
    deadline = time.monotonic() + timeout
    done: dict[int, tuple[str, float]] = {}
    while True:
        missing = [i for i in range(len(keys)) if i not in done]
        for start in range(0, len(missing), 1000):
            chunk = missing[start : start + 1000]
            for i, raw in zip(chunk, conn.mget([keys[i] for i in chunk]), strict=True):
                if raw is not None:
                    meta = json.loads(raw)
                    if meta.get("status") != "SUCCESS":
                        raise BenchError(f"celery task {ids[i]}: {meta.get('status')}")
                    done[i] = (
                        str(meta.get("result")),
                        _epoch_ms(datetime.fromisoformat(meta["date_done"])),
                    )
        if len(done) == len(keys):
            return list(done.values())
        if proc.proc.poll() is not None:
            raise BenchError(f"celery worker exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"celery: {len(done)}/{len(keys)} done in {timeout} s")
        time.sleep(1.0)


# ---- output ----------------------------------------------------------------------------


def table(result: BacklogResult) -> Table:
    server = f"; runfleet's Postgres: {result.server.label}" if result.server else ""
    load_after = f", after {result.load_after[0]:.1f}" if result.load_after else ""
    out = Table(
        title=f"backlog drain, runs/s over the steady window (from 10% done and every worker "
        f"process working, to 100%; {result.workers} worker processes each; load average "
        f"before {result.load_before[0]:.1f}{load_after}{server})"
    )
    out.add_column("pending at start", justify="right")
    for system in SYSTEMS:
        out.add_column(system, justify="right")
    out.add_column("runfleet / Celery", justify="right")
    out.add_column("messages / run", justify="right")
    out.add_column("claim-lost", justify="right")
    out.add_column("updates (HOT) / run", justify="right")
    out.add_column("WAL records / flushes / commits per run", justify="right")
    for depth in result.depths:
        cells = []
        for system in SYSTEMS:
            row = result.of(system, depth)
            warm = "" if row is None or row.window.starts is WindowStart.TENTH else "*"
            cells.append(f"{row.steady_per_s:,.0f}{warm}" if row else "—")
        rf, celery = result.of("runfleet", depth), result.of("celery", depth)
        ratio = f"{rf.steady_per_s / celery.steady_per_s:.2f}x" if rf and celery else "—"
        msgs = f"{rf.extra['messages_per_run']:.3f}" if rf else "—"
        lost = f"{rf.extra['claim_lost']:,.0f}" if rf else "—"
        upd = (
            f"{rf.extra['updates_per_run']:.1f} ({rf.extra['hot_updates_per_run']:.1f})"
            if rf
            else "—"
        )
        wal = (
            f"{rf.extra['wal_records_per_run']:.1f} / {rf.extra['wal_flushes_per_run']:.3f} / "
            f"{rf.extra['commits_per_run']:.3f}"
            if rf
            else "—"
        )
        out.add_row(f"{depth:,}", *cells, ratio, msgs, lost, upd, wal)
    for name, (measured, met) in result.targets().items():
        out.add_row(name, measured, "met" if met else "NOT met", *[""] * 7)
    out.caption = (
        "* the window does not start at 10% done: a worker process started later (--json "
        "says where it starts)"
    )
    return out
