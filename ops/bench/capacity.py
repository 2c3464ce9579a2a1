"""``runfleet bench capacity``: what one run costs Postgres and Redis, counted by the servers.

A capacity plan needs per-run costs, not a throughput on one laptop: statements, write
transactions and WAL bytes per run and per step, Redis commands per run, connections per
worker process, and what an idle worker costs per second (heartbeats, sweeps, stream
reads). The benchmark starts its own Postgres (``pg_stat_statements`` preloaded) and
Redis so that nothing else moves their counters, runs one worker process, and reads:

- statements: ``pg_stat_statements`` calls (``track = top``: what clients sent);
- write transactions: next-xid delta (only a transaction that writes takes an xid,
  and each costs a WAL flush at commit); BEGIN blocks: the ``COMMIT`` calls;
- WAL bytes: ``pg_current_wal_lsn()`` delta;
- Redis: ``INFO commandstats`` call deltas (commands inside a Lua script count too,
  as they do for the server's CPU);
- CPU: utime + stime of the Postgres server (postmaster and backends) and of
  redis-server, from /proc; with ``fsync = off`` on the throwaway, so disk flushes are
  not in it;
- connections: the worker's backends / Redis clients right after each batch (its
  pools keep what the batch made them open).

Each batch's figures have the idle worker's background (measured first, per second)
subtracted for the batch's duration. A run's producer side (``enqueue_many``, batched
by 500) is included: that is what a run costs end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from rich.table import Table

from runfleet.ops.bench.procs import runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError
from runfleet.ops.bench.three_steps import QUEUE, three_steps
from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q
from runfleet.store.types import RunStatus
from runfleet.worker import Context, flow

FLOWS_MODULE = "runfleet.ops.bench.capacity"
BATCH = 500


@flow(name="bench.zero_steps", queue=QUEUE)
async def zero_steps(ctx: Context, x: int) -> int:
    """A run with no recorded call: the cost of the lifecycle alone."""
    return x


@dataclass(frozen=True, slots=True)
class Counters:
    at: float
    statements: int
    commits: int
    next_xid: int
    wal: int
    redis: Counter[str]
    pg_cpu: float
    """CPU seconds of the postmaster and every backend (live or exited)."""
    redis_cpu: float


@dataclass(frozen=True, slots=True)
class Cost:
    """Counter deltas divided by a number of units (runs, steps, or seconds)."""

    statements: float
    write_transactions: float
    begin_blocks: float
    wal_bytes: float
    redis_commands: float
    pg_cpu_ms: float = 0.0
    redis_cpu_ms: float = 0.0
    redis_by_command: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "postgres_cpu_ms": round(self.pg_cpu_ms, 3),
            "redis_cpu_ms": round(self.redis_cpu_ms, 3),
            "statements": round(self.statements, 2),
            "write_transactions": round(self.write_transactions, 2),
            "begin_commit_blocks": round(self.begin_blocks, 2),
            "wal_bytes": round(self.wal_bytes),
            "redis_commands": round(self.redis_commands, 2),
            "redis_by_command": {k: round(v, 2) for k, v in self.redis_by_command.items()},
        }


def _cost(a: Counters, b: Counters, units: float, background: Cost | None = None) -> Cost:
    seconds = b.at - a.at
    bg = background or Cost(0, 0, 0, 0, 0)
    by_cmd = {
        cmd: ((b.redis[cmd] - a.redis[cmd]) - bg.redis_by_command.get(cmd, 0) * seconds) / units
        for cmd in sorted(set(b.redis) | set(a.redis))
        if b.redis[cmd] != a.redis[cmd]
    }
    return Cost(
        statements=(b.statements - a.statements - bg.statements * seconds) / units,
        write_transactions=(b.next_xid - a.next_xid - bg.write_transactions * seconds) / units,
        begin_blocks=(b.commits - a.commits - bg.begin_blocks * seconds) / units,
        wal_bytes=(b.wal - a.wal - bg.wal_bytes * seconds) / units,
        redis_commands=sum(v for v in by_cmd.values()),
        pg_cpu_ms=((b.pg_cpu - a.pg_cpu) * 1000 - bg.pg_cpu_ms * seconds) / units,
        redis_cpu_ms=((b.redis_cpu - a.redis_cpu) * 1000 - bg.redis_cpu_ms * seconds) / units,
        redis_by_command={k: v for k, v in by_cmd.items() if abs(v) >= 0.01},
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    runs: int
    concurrency: int
    per_run_zero_steps: Cost
    per_run_three_steps: Cost
    per_step: Cost
    idle_worker_per_s: Cost
    postgres_connections_per_process: int
    redis_connections_per_process: int
    three_step_runs_per_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "concurrency": self.concurrency,
            "per_run_zero_steps": self.per_run_zero_steps.as_json(),
            "per_run_three_steps": self.per_run_three_steps.as_json(),
            "per_step": self.per_step.as_json(),
            "idle_worker_per_s": self.idle_worker_per_s.as_json(),
            "postgres_connections_per_process": self.postgres_connections_per_process,
            "redis_connections_per_process": self.redis_connections_per_process,
            "three_step_runs_per_s_this_machine": round(self.three_step_runs_per_s, 1),
        }


class _Meter:
    """Reads the counters of one Postgres database and one Redis server."""

    IGNORED = frozenset({"info", "ping", "client|setname", "client|list"})

    def __init__(
        self, pg: psycopg.Connection[tuple[Any, ...]], rd: redis.Redis, pids: tuple[int, int]
    ) -> None:
        self.pg = pg
        self.rd = rd
        self.postmaster, self.redis_pid = pids
        self.peak_backends = 0
        self.peak_clients = 0

    def read(self) -> Counters:
        row = self.pg.execute(q("bench.capacity_counters")).fetchone()
        assert row is not None
        stats = self.rd.info("commandstats")
        calls = Counter(
            {
                key.removeprefix("cmdstat_"): int(value["calls"])
                for key, value in stats.items()
                if key.removeprefix("cmdstat_") not in self.IGNORED
            }
        )
        return Counters(time.monotonic(), int(row[0]), int(row[1]), int(row[2]), int(row[3]),
                        calls, _tree_cpu(self.postmaster), _tree_cpu(self.redis_pid))  # fmt: skip

    def sample_connections(self) -> None:
        row = self.pg.execute(q("bench.capacity_backends")).fetchone()
        clients = int(self.rd.info("clients")["connected_clients"]) - 1  # not ours
        self.peak_backends = max(self.peak_backends, int(row[0]) if row else 0)
        self.peak_clients = max(self.peak_clients, clients)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int, *, reaped: bool) -> float:
    """utime + stime of ``pid`` (and of its exited, reaped children), seconds (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    used = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        used += int(fields[13]) + int(fields[14])  # cutime, cstime
    return used / _TICK


def _tree_cpu(pid: int) -> float:
    """A server's CPU: the process, its exited children, and its live children."""
    total = _cpu(pid, reaped=True)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                total += _cpu(int(stat.parent.name), reaped=False)
    return total


async def _batch(
    settings: Settings, meter: _Meter, flow_fn: Any, runs: int
) -> tuple[Counters, Counters]:
    before = meter.read()
    async with AsyncQueue(QUEUE, settings=settings) as queue:
        for start in range(0, runs, BATCH):
            count = min(BATCH, runs - start)
            await queue.enqueue_many([EnqueueSpec(flow_fn, (start + i,)) for i in range(count)])
        deadline = time.monotonic() + 300
        while True:
            counts = await queue.store.stats.status_counts(flow=flow_fn.name)
            if counts[RunStatus.FAILED] or counts[RunStatus.CANCELLED]:
                raise BenchError(f"{flow_fn.name}: runs failed or were cancelled: {counts}")
            if counts[RunStatus.COMPLETED] >= runs:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{flow_fn.name}: {counts} after 300 s")
            await asyncio.sleep(0.05)
    # The producer's connections are closed now; the worker's pools keep what they grew
    # to under load (psycopg_pool and redis-py close idle connections only much later).
    meter.sample_connections()
    return before, meter.read()


async def run(base: Settings, *, runs: int, concurrency: int, idle_s: float) -> Capacity:
    """Start the servers and one worker; measure idle, a zero-step batch, a three-step one."""
    pgss = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
            "pg_stat_statements.max": "5000"}  # fmt: skip
    with ThrowawayPostgres(extra_settings=pgss) as pg, ThrowawayRedis() as rd:
        await migrate(pg.url)
        settings = base.model_copy(update={"database_url": pg.url, "redis_url": rd.url})
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(q("bench.capacity_extension"))
            pids = (_pid(pg), _pid(rd))
            meter = _Meter(conn, redis.Redis.from_url(rd.url, decode_responses=True), pids)
            worker = runfleet_worker(settings, flows=FLOWS_MODULE, queues=QUEUE,
                                     concurrency=concurrency)  # fmt: skip
            try:
                await wait_workers_started(settings, [worker], timeout=60)
                await asyncio.sleep(2)  # past start-up (registration, first sweeps)
                a = meter.read()
                await asyncio.sleep(idle_s)
                idle = _cost(a, meter.read(), idle_s)
                z0, z1 = await _batch(settings, meter, zero_steps, runs)
                t0, t1 = await _batch(settings, meter, three_steps, runs)
            finally:
                worker.close()
    zero = _cost(z0, z1, runs, idle)
    three = _cost(t0, t1, runs, idle)
    step = Cost(
        statements=(three.statements - zero.statements) / 3,
        write_transactions=(three.write_transactions - zero.write_transactions) / 3,
        begin_blocks=(three.begin_blocks - zero.begin_blocks) / 3,
        wal_bytes=(three.wal_bytes - zero.wal_bytes) / 3,
        redis_commands=(three.redis_commands - zero.redis_commands) / 3,
        pg_cpu_ms=(three.pg_cpu_ms - zero.pg_cpu_ms) / 3,
        redis_cpu_ms=(three.redis_cpu_ms - zero.redis_cpu_ms) / 3,
    )
    return Capacity(
        runs=runs,
        concurrency=concurrency,
        per_run_zero_steps=zero,
        per_run_three_steps=three,
        per_step=step,
        idle_worker_per_s=idle,
        postgres_connections_per_process=meter.peak_backends,
        redis_connections_per_process=meter.peak_clients,
        three_step_runs_per_s=runs / (t1.at - t0.at),
    )


def _pid(server: ThrowawayPostgres | ThrowawayRedis) -> int:
    proc = server._proc  # the harness keeps the server's Popen; the pid is all this reads
    if proc is None:
        raise BenchError(f"{server.name} is not running")
    return proc.pid


def table(result: Capacity) -> Table:
    table = Table(
        title=f"capacity: {result.runs} runs per batch, one worker process, "
        f"concurrency {result.concurrency}"
    )
    table.add_column("")
    for title in ("per run (0 steps)", "per run (3 steps)", "per step", "idle worker per s"):
        table.add_column(title, justify="right")
    costs = (result.per_run_zero_steps, result.per_run_three_steps, result.per_step,
             result.idle_worker_per_s)  # fmt: skip
    table.add_row("statements", *(f"{c.statements:.1f}" for c in costs))
    table.add_row("write transactions", *(f"{c.write_transactions:.1f}" for c in costs))
    table.add_row("BEGIN..COMMIT blocks", *(f"{c.begin_blocks:.1f}" for c in costs))
    table.add_row("WAL bytes", *(f"{c.wal_bytes:,.0f}" for c in costs))
    table.add_row("Redis commands", *(f"{c.redis_commands:.1f}" for c in costs))
    table.add_row("Postgres CPU ms", *(f"{c.pg_cpu_ms:.3f}" for c in costs))
    table.add_row("Redis CPU ms", *(f"{c.redis_cpu_ms:.3f}" for c in costs))
    table.add_section()
    table.add_row("Postgres connections / process", str(result.postgres_connections_per_process))
    table.add_row("Redis connections / process", str(result.redis_connections_per_process))
    table.add_row("3-step runs/s (this machine)", f"{result.three_step_runs_per_s:.0f}")
    return table
