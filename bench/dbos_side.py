"""The DBOS side of the flows benchmark: the same three steps, DBOS's own queue.

DBOS keeps its state in a system database of its own: it gets a scratch database on the
same Postgres server as runfleet's. Its executors are separate processes
(``dbos_app``), started only after the backlog is enqueued (with ``DBOSClient``) so that
both systems drain a standing backlog. Timestamps are DBOS's (``dequeued_at``,
``completed_at``: epoch ms) — the same kind of window runfleet's journal gives.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.figures import rate
from runfleet.ops.bench.procs import Proc, python_env
from runfleet.ops.bench.scratch import BenchError, scratch_database

DBOS_MISSING = (
    "DBOS is not installed: the flows benchmark runs it side by side with runfleet. "
    "Install it (pip install dbos, or this project's 'bench' extra) or pass --skip-dbos."
)


def available() -> bool:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Throughput:
    """``flows`` drained: wall time from executor spawn, and first start to last finish."""

    flows: int
    wall_s: float
    window_s: float

    @property
    def per_s(self) -> float:
        return rate(self.flows, self.window_s)

    @property
    def wall_per_s(self) -> float:
        return rate(self.flows, self.wall_s)

    def as_json(self) -> dict[str, float]:
        return {
            "flows": self.flows,
            "wall_s": round(self.wall_s, 3),
            "window_s": round(self.window_s, 3),
            "flows_per_s": round(self.per_s, 1),
            "wall_flows_per_s": round(self.wall_per_s, 1),
        }


def _executor(url: str, concurrency: int, polling: float) -> Proc:
    env = python_env(
        {
            "RF_BENCH_DBOS_URL": url,
            "RF_BENCH_DBOS_CONCURRENCY": str(concurrency),
            "RF_BENCH_DBOS_POLLING": str(polling),
        }
    )
    return Proc([sys.executable, "-m", "bench.dbos_app"], env)


async def _ready(procs: list[Proc], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all("dbos.ready" in p.tail(100_000) for p in procs):
        for proc in procs:
            if proc.proc.poll() is not None:
                raise BenchError(f"DBOS executor exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError("DBOS executors did not start within 60 s")
        await asyncio.sleep(0.05)


def _enqueue(client: Any, flows: int) -> None:
    from bench.dbos_app import QUEUE, VERSION, WORKFLOW

    options: Any = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "app_version": VERSION}
    for i in range(flows):
        client.enqueue(options, i)


def _statuses(client: Any) -> list[Any]:
    from bench.dbos_app import QUEUE

    return list(client.list_workflows(queue_name=QUEUE, load_input=False, load_output=False))


async def run(
    admin_url: str, *, flows: int, workers: int, concurrency: int, polling: float
) -> Throughput:
    """Drain ``flows`` three-step workflows with ``workers`` executors x ``concurrency``."""
    if not available():
        raise BenchError(DBOS_MISSING)
    from dbos import DBOSClient

    from bench.dbos_app import APP

    async with scratch_database(admin_url, "rf_bench_dbos") as url:
        url = url if "://" in url else _as_url(url)
        first = _executor(url, concurrency, polling)  # creates and migrates the schema
        try:
            await _ready([first])
        finally:
            first.terminate()
            first.close()
        client = DBOSClient(system_database_url=url, application_name=APP)
        procs: list[Proc] = []
        try:
            await asyncio.to_thread(_enqueue, client, flows)
            began = time.perf_counter()
            procs = [_executor(url, concurrency, polling) for _ in range(workers)]
            deadline = time.monotonic() + 600
            while True:
                done = [s for s in await asyncio.to_thread(_statuses, client)]
                finished = [s for s in done if s.status in ("SUCCESS", "ERROR", "CANCELLED")]
                if len(finished) >= flows:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"DBOS finished {len(finished)}/{flows} in 600 s")
                for proc in procs:
                    if proc.proc.poll() is not None:
                        raise BenchError(f"DBOS executor exited:\n{proc.tail()}")
                await asyncio.sleep(0.1)
            wall = time.perf_counter() - began
            failed = [s for s in finished if s.status != "SUCCESS"]
            if failed:
                raise BenchError(f"{len(failed)} DBOS workflows did not succeed")
            starts = [s.dequeued_at for s in finished if s.dequeued_at]
            ends = [s.completed_at for s in finished if s.completed_at]
            if not starts or not ends:
                raise BenchError("DBOS workflows carry no dequeued_at/completed_at")
            return Throughput(flows, wall, (max(ends) - min(starts)) / 1000)
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
            client.destroy()


def _as_url(conninfo: str) -> str:
    """DBOS (SQLAlchemy) wants a URL; scratch databases may be key=value conninfo."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(conninfo)
    user = parts.get("user", "postgres")
    password = f":{parts['password']}" if parts.get("password") else ""
    host, port = parts.get("host", "127.0.0.1"), parts.get("port", 5432)
    return f"postgresql://{user}{password}@{host}:{port}/{parts.get('dbname')}"
