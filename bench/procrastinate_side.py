"""The procrastinate side of ``python -m bench producer``: the durable Postgres peer.

procrastinate, like runfleet, commits a row to enqueue (``defer``: one ``INSERT`` into
``procrastinate_jobs`` whose triggers add its ``deferred`` event and ``NOTIFY`` the
workers) and a row update to start a job (its workers' fetch sets ``doing`` and adds the
``started`` event). It gets a scratch database of its own on the same Postgres server,
its schema applied there with its own ``SchemaManager``; ``workers`` real worker
processes (``python -m procrastinate --app=bench.procrastinate_app.app worker``, LISTEN
on, ``concurrency`` jobs each) serve one queue, and a second queue no worker serves takes
the enqueue-alone calls, as the other sides' admissions do (its jobs are deleted after
each figure, untimed: a standing ``todo`` backlog would lengthen every fetch). Producers
defer the no-op by name on an app of their own: ``SyncPsycopgConnector`` for the sync
shapes and ``PsycopgConnector`` for the asyncio tasks, each pool bounded as runfleet's
default ``Settings`` bounds its own (``pool_min``..``pool_max``).

Waiting for a job: procrastinate keeps no result and sends no notification when a job
ends (its ``NOTIFY`` tells workers of inserts and abort requests only), so a producer
that waits polls the job's status with procrastinate's own ``JobManager.get_job_status``
(one primary-key ``SELECT``) on its pool: first ``POLL_FIRST_S`` after the ``defer``, the
pause doubling to ``POLL_MAX_S``. That is the fastest wait its API offers without changing
its schema. A poll costs a round trip that the push-based waits of the other sides
(runfleet's ``settled`` notice, rq's result stream, Celery's result channel) do not; the
cap bounds what polling adds to a finished job's wait, and the doubling keeps a waiting
thread from loading the server while the job runs.

The idle start is procrastinate's own record: each job's ``deferred`` event to its
``started`` event in ``procrastinate_events``, both ``now()`` of their transactions on the
database's clock.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from runfleet.ops.bench.procs import Proc, python_env
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.store.config import Settings

PROCRASTINATE_MISSING = "not installed (pip install -e '.[bench]')"

TRIP_QUEUE = "rf-bench-trip"
"""The queue the worker processes serve."""
ADMIT_QUEUE = "rf-bench-admit"
"""Enqueue alone: no worker serves it, so its jobs never queue before the round trips."""

POLL_FIRST_S = 0.0005
POLL_MAX_S = 0.002
"""The status poll's first pause after ``defer`` and its cap (doubling in between)."""
RESULT_TIMEOUT = 120.0

POOL_MIN = int(Settings.model_fields["pool_min"].default)
POOL_MAX = int(Settings.model_fields["pool_max"].default)
"""A producer's pool: the bounds runfleet's producers get by default."""


def available() -> bool:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Side:
    """A scratch database with procrastinate's schema and its running worker processes."""

    url: str
    procs: tuple[Proc, ...]


@asynccontextmanager
async def side(admin_url: str, workers: int, concurrency: int) -> AsyncIterator[Side]:
    """procrastinate's schema in a scratch database and ``workers`` worker processes serving
    ``TRIP_QUEUE``, registered before this yields; all stopped and dropped afterwards."""
    from procrastinate import App, PsycopgConnector

    async with scratch_database(admin_url, "rf_bench_procrastinate") as url:
        async with App(connector=PsycopgConnector(conninfo=url)).open_async() as app:
            await app.schema_manager.apply_schema_async()
        argv = [
            sys.executable, "-m", "procrastinate", "--app=bench.procrastinate_app.app",
            "worker", "--queues", TRIP_QUEUE, "--concurrency", str(concurrency),
        ]  # fmt: skip
        env = python_env({"RF_PROCRASTINATE_DSN": url})
        procs = tuple(Proc(argv, env) for _ in range(workers))
        try:
            await asyncio.to_thread(_wait_registered, url, procs, 60.0)
            yield Side(url, procs)
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()


def _wait_registered(url: str, procs: Sequence[Proc], timeout: float) -> None:
    """Until every worker process has its row in ``procrastinate_workers``."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
            if row is not None and row[0] >= len(procs):
                return
            for proc in procs:
                if proc.proc.poll() is not None:
                    raise BenchError(f"procrastinate worker exited:\n{proc.tail()}")
            if time.monotonic() > deadline:
                tails = "\n".join(p.tail() for p in procs)
                raise BenchError(f"procrastinate workers did not register in {timeout:.0f} s\n"
                                 f"{tails}")  # fmt: skip
            time.sleep(0.05)


# ---- producers ---------------------------------------------------------------------------


@contextmanager
def sync_app(url: str) -> Iterator[Any]:
    """A sync producer's app (``SyncPsycopgConnector``), open; its pool shared by threads."""
    from procrastinate import App, SyncPsycopgConnector

    connector = SyncPsycopgConnector(conninfo=url, min_size=POOL_MIN, max_size=POOL_MAX)
    app = App(connector=connector)
    app.open()
    try:
        yield app
    finally:
        app.close()


@asynccontextmanager
async def async_app(url: str) -> AsyncIterator[Any]:
    """An asyncio producer's app (``PsycopgConnector``), open; its pool shared by tasks."""
    from procrastinate import App, PsycopgConnector

    connector = PsycopgConnector(conninfo=url, min_size=POOL_MIN, max_size=POOL_MAX)
    async with App(connector=connector).open_async() as app:
        yield app


def deferrer(app: Any, queue: str) -> Any:
    """The no-op task on ``queue``, by name (the producer does not import the task)."""
    from bench.procrastinate_app import TASK

    return app.configure_task(TASK, queue=queue)


def _done(job_id: int, status: Any) -> bool:
    from procrastinate.jobs import Status

    if status is Status.SUCCEEDED:
        return True
    if status in (Status.TODO, Status.DOING):
        return False
    raise BenchError(f"procrastinate job {job_id} ended {status.value}")


def wait(app: Any, job_id: int, timeout: float = RESULT_TIMEOUT) -> None:
    """Until the job has succeeded: its status polled (see the module's docstring)."""
    deadline = time.monotonic() + timeout
    pause = POLL_FIRST_S
    while True:
        time.sleep(pause)
        if _done(job_id, app.job_manager.get_job_status(job_id)):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"procrastinate job {job_id} not done after {timeout:.0f} s")
        pause = min(pause * 2, POLL_MAX_S)


async def wait_async(app: Any, job_id: int, timeout: float = RESULT_TIMEOUT) -> None:
    """``wait`` for an asyncio producer."""
    deadline = time.monotonic() + timeout
    pause = POLL_FIRST_S
    while True:
        await asyncio.sleep(pause)
        if _done(job_id, await app.job_manager.get_job_status_async(job_id)):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"procrastinate job {job_id} not done after {timeout:.0f} s")
        pause = min(pause * 2, POLL_MAX_S)


def clear_admitted(url: str) -> None:
    """Delete the enqueue-alone jobs (untimed): its workers' fetch walks every ``todo`` job
    in priority order, so a standing backlog on a queue they do not serve would slow each
    fetch of the round trips that follow."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = %s", (ADMIT_QUEUE,))


# ---- the idle start ----------------------------------------------------------------------


async def idle_starts(
    admin_url: str, workers: int, concurrency: int, samples: int, gap_s: float
) -> list[float]:
    """Idle workers LISTENing on their queue; one job every ``gap_s``; each job's
    ``deferred`` -> ``started`` events (ms, the database's clock)."""
    async with side(admin_url, workers, concurrency) as found:
        return await asyncio.to_thread(_spaced, found.url, workers, samples, gap_s)


def _spaced(url: str, workers: int, samples: int, gap_s: float) -> list[float]:
    import psycopg

    with sync_app(url) as app:
        trip = deferrer(app, TRIP_QUEUE)
        for job_id in [trip.defer() for _ in range(workers * 5)]:  # warm every worker
            wait(app, job_id)
        ids: list[int] = []
        for _ in range(samples):
            ids.append(trip.defer())
            time.sleep(gap_s)
        for job_id in ids:
            wait(app, job_id)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT d.job_id, EXTRACT(EPOCH FROM s.at - d.at) * 1000"
            " FROM procrastinate_events d JOIN procrastinate_events s"
            " ON s.job_id = d.job_id AND s.type = 'started'"
            " WHERE d.type = 'deferred' AND d.job_id = ANY(%s)",
            (ids,),
        ).fetchall()
    if len(rows) != len(ids):
        raise BenchError(f"{len(ids) - len(rows)} procrastinate jobs have no started event")
    return [float(ms) for _job, ms in rows]
