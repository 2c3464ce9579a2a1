"""Sixteen worker processes through PgBouncer (transaction mode) to a Postgres that
admits only 40 connections, with four workers SIGKILLed mid-batch.

Without the pooler the fleet could not even start: 16 processes × (8 pooled + 2 lease)
connections is 160 sessions against ``max_connections = 40``. Through PgBouncer they
share ``POOL_SIZE`` server connections. What must hold is what the chaos tests demand
everywhere: every run completes with its result, none is settled twice, no recorded
step executes again; and the backend never sees more sessions than the pool allows.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

import tests.chaos.flows as cf
from runfleet.ops.servers.postgres import ThrowawayPgBouncer, ThrowawayPostgres
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.chaos.harness import _outcome, _poll, assert_clean, wait_for_ledger
from tests.fleet.procs import WorkerProc

# Its own deadlines (boot 60 s, first steps 60 s, settled 120 s after the kills) report
# with the workers' logs; the suite's 120 s timeout would cut them off first.
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

PROCESSES = 16
CONCURRENCY = 32
RUNS = 480
KILLED = 4
MAX_CONNECTIONS = 40
POOL_SIZE = 30
"""Server connections PgBouncer may open: 40 minus superuser_reserved_connections (3)
minus room for the test's own direct admin sessions."""
PER_PROCESS = 8 + 2
"""A worker's client connections: the store pool (RUNFLEET_POOL_MAX, 8) and the lease
pool (2). Notifications are Redis pub/sub: no LISTEN connection."""


@pytest.fixture
def small_postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres(durable_commits=True, max_connections=MAX_CONNECTIONS) as server:
        yield server


@pytest.fixture
def bouncer(small_postgres: ThrowawayPostgres) -> Iterator[ThrowawayPgBouncer]:
    with ThrowawayPgBouncer(small_postgres, pool_size=POOL_SIZE) as server:
        yield server


@dataclass
class Peaks:
    """Highest connection counts seen while the batch ran."""

    backends: int = 0
    clients: int = 0
    servers: int = 0
    waiting: int = 0
    samples: int = 0


def _sample(admin_url: str, bouncer: ThrowawayPgBouncer, peaks: Peaks) -> None:
    """One look at the backend (``pg_stat_activity``) and the pooler (``SHOW POOLS``)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    # The admin console speaks the simple query protocol only: a client-side cursor.
    with psycopg.connect(
        bouncer.url_for("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor
    ) as console:
        cur = console.execute("SHOW POOLS")
        names = [d.name for d in cur.description or ()]
        pools = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    ours = [p for p in pools if p["database"] == "postgres"]
    peaks.backends = max(peaks.backends, int(row[0]) if row else 0)
    peaks.clients = max(peaks.clients, sum(p["cl_active"] + p["cl_waiting"] for p in ours))
    peaks.servers = max(
        peaks.servers, sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] for p in ours)
    )
    peaks.waiting = max(peaks.waiting, sum(p["cl_waiting"] for p in ours))
    peaks.samples += 1


async def _watch(admin_url: str, bouncer: ThrowawayPgBouncer, peaks: Peaks) -> None:
    while True:
        await asyncio.to_thread(_sample, admin_url, bouncer, peaks)
        await asyncio.sleep(0.5)


async def test_sixteen_workers_through_pgbouncer_on_forty_connections(
    settings: Settings,
    small_postgres: ThrowawayPostgres,
    bouncer: ThrowawayPgBouncer,
    own_ledger: str,
) -> None:
    await migrate(small_postgres.url)  # direct: migrate holds a session advisory lock
    ours = settings.model_copy(
        update={
            "database_url": bouncer.url,
            "prepare_threshold": None,
            # The production defaults, not the suite's 0.2 s: 16 processes renewing and
            # sweeping five times a second would be most of this machine's work.
            "heartbeat_interval": 1.0,
            "stale_after": 5.0,
            "sweep_interval": 1.0,
        }
    )
    admin = small_postgres.url
    started = time.monotonic()
    peaks = Peaks()
    workers = [
        WorkerProc(ours, flows="tests.chaos.flows", concurrency=CONCURRENCY,
                   chaos_ledger_url=own_ledger)
        for _ in range(PROCESSES)
    ]  # fmt: skip
    watcher = asyncio.create_task(_watch(admin, bouncer, peaks))
    try:
        for w in workers:
            await w.wait_started(timeout=60)
        boot = time.monotonic() - started
        async with AsyncQueue("default", settings=ours) as queue:
            handles = await queue.enqueue_many(
                [EnqueueSpec(cf.five_steps, (i,)) for i in range(RUNS)]
            )
        await wait_for_ledger(own_ledger, RUNS * cf.STEPS // 5, timeout=60)
        owners = await _poll(
            admin,
            "SELECT owner_pid, count(*) FROM runfleet.runs WHERE status = 'running' "
            "GROUP BY 1 ORDER BY 2 DESC",
        )
        busy = {int(pid) for pid, _ in owners or []}  # type: ignore[call-overload]  # rows are tuples of object; the column is an integer
        victims = [w for w in workers if w.pid in busy][:KILLED]
        assert len(victims) == KILLED, f"only {len(busy)} workers own runs: {owners}"
        for w in victims:
            w.signal(signal.SIGKILL)
        deadline = time.monotonic() + 120  # ~20-40 s on this shared 2-core machine
        while True:
            rows = await _poll(
                admin,
                "SELECT count(*) FROM runfleet.runs "
                "WHERE status NOT IN ('completed', 'failed', 'cancelled')",
            )
            if rows is not None and rows[0][0] == 0:
                break
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {w.pid}:\n{w.log()[-3000:]}" for w in workers[-2:])
                raise TimeoutError(f"{rows} runs unsettled after 120 s\n{logs}")
            await asyncio.sleep(0.2)
        settled = time.monotonic() - started
    finally:
        watcher.cancel()
        for w in workers:
            w.close()
    admin_settings = ours.model_copy(update={"database_url": admin})
    async with AsyncQueue("default", settings=admin_settings) as queue:
        expected = sum(range(1, cf.STEPS + 1))
        results_ok = [await queue.run(h.id).return_value() for h in handles] == [
            expected + i for i in range(RUNS)
        ]
        settled_twice = await queue.store.stats.settled_more_than_once()
    outcome = await _outcome(admin, own_ledger, RUNS, settled, results_ok, settled_twice)
    print(
        f"scale: boot {boot:.1f}s, settled at {settled:.1f}s, peaks {peaks}, "
        f"{peaks.clients / PROCESSES:.1f} client connections per process"
    )
    assert_clean(outcome, RUNS)
    # Four owners died holding runs: their runs were taken over, not lost.
    steals = await _poll(
        admin, "SELECT count(*) FROM runfleet.journal WHERE kind = 'stolen-and-activated'"
    )
    assert steals and int(steals[0][0]) > 0, steals  # type: ignore[call-overload]  # rows are tuples of object; the column is an integer
    assert peaks.samples >= 3
    # The pooler's server connections, plus at most the test's own direct polls.
    assert peaks.backends <= POOL_SIZE + 2 < MAX_CONNECTIONS, peaks
    assert peaks.servers <= POOL_SIZE, peaks
    # More clients than server connections at once: the pooler really multiplexed.
    assert peaks.clients > POOL_SIZE, peaks
    assert peaks.clients <= PROCESSES * PER_PROCESS + 2, peaks
