"""Producer services of every shape, beside rq's, Celery's and procrastinate's: rate, p50
and p99 per shape.

A service enqueues from one thread (a script), from threads sharing one sync ``Queue`` (a
WSGI server's request threads) or from asyncio tasks sharing one ``AsyncQueue`` (an ASGI
server's requests). Each shape is measured two ways: ``enqueue`` alone (admission: every
runfleet run durable before its call returns; no worker serves that queue) and
``enqueue`` then waiting for the result (the round trip, with ``workers`` idle worker
processes a side). Every call is timed, so each figure is a rate and its p50 / p99.

rq's and Celery's producers are sync: they run the one-thread and threads shapes (threads
sharing one rq ``Queue`` on one Redis connection pool; one Celery app's producer pool),
and have no tasks shape. procrastinate, the durable Postgres peer, runs all three:
threads share one sync app (``defer``), tasks one async app (``defer_async``); it has no
result, so its round trip polls the job's status (``bench.procrastinate_side``). Rounds
alternate the systems; a rate is the median of its rounds, a percentile is over every
call of every round.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rich.table import Table

from bench import procrastinate_side, rq_side
from bench.drain import drop_keys
from bench.figures import percentile, rate
from bench.noop import noop, noop_flow
from bench.servers import Servers, bench_prefix
from runfleet.ops.bench.procs import Proc, python_env, runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.producer import AsyncQueue
from runfleet.rqface import Queue
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate

ADMIT_QUEUE = "bench-shapes-admit"
"""Admission alone: no worker serves it, so its runs never queue before the round trips."""
TRIP_QUEUE = "bench-shapes"
RESULT_TIMEOUT = 120.0
NOOP_FLOWS = "bench.noop"


class Shape(StrEnum):
    """How a producer service calls ``enqueue``."""

    ONE_THREAD = "one thread"
    THREADS = "threads sharing one Queue"
    TASKS = "asyncio tasks sharing one AsyncQueue"


class Mode(StrEnum):
    """What each call waits for."""

    ENQUEUE = "enqueue"
    ROUND_TRIP = "enqueue, then wait()"


class System(StrEnum):
    RUNFLEET = "runfleet"
    RQ = "rq"
    CELERY = "celery"
    PROCRASTINATE = "procrastinate"


@dataclass(frozen=True, slots=True)
class Calls:
    """One round of one shape: calls per second, and each call's duration."""

    per_s: float
    latencies_ms: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Figure:
    """One system, shape and mode over every round."""

    rounds: tuple[Calls, ...]

    @property
    def per_s(self) -> float:
        return statistics.median(c.per_s for c in self.rounds)

    def p(self, q: int) -> float:
        return percentile([ms for c in self.rounds for ms in c.latencies_ms], q)

    def as_json(self) -> dict[str, Any]:
        return {
            "per_s": round(self.per_s, 1),
            "p50_ms": round(self.p(50), 3),
            "p99_ms": round(self.p(99), 3),
            "rounds_per_s": [round(c.per_s, 1) for c in self.rounds],
        }


Key = tuple[System, Shape, Mode]


@dataclass(frozen=True, slots=True)
class ShapesResult:
    runs: int
    threads: int
    tasks: int
    workers: int
    rounds: int
    figures: dict[Key, Figure]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    skipped: dict[System, str] = field(default_factory=dict)

    def label(self, shape: Shape) -> str:
        match shape:
            case Shape.ONE_THREAD:
                return "one thread"
            case Shape.THREADS:
                return f"{self.threads} threads sharing one Queue"
            case Shape.TASKS:
                return f"{self.tasks} asyncio tasks sharing one AsyncQueue"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (system, shape, mode), figure in self.figures.items():
            out.setdefault(shape.name.lower(), {}).setdefault(mode.name.lower(), {})[
                system.value
            ] = figure.as_json()
        return {
            "runs": self.runs,
            "threads": self.threads,
            "tasks": self.tasks,
            "workers": self.workers,
            "rounds": self.rounds,
            "load_average_before": list(self.load_before),
            "load_average_after": list(self.load_after),
            "shapes": out,
            "skipped": {s.value: why for s, why in self.skipped.items()},
        }


# ---- timing ------------------------------------------------------------------------------


def threaded(threads: int, runs: int, one: Callable[[], Any]) -> Calls:
    """``runs`` calls of ``one`` spread over ``threads`` threads started together."""
    share = [runs // threads + (1 if i < runs % threads else 0) for i in range(threads)]
    gate = threading.Barrier(threads + 1)
    spans: list[list[float]] = [[] for _ in share]
    errors: list[BaseException] = []

    def loop(n: int, mine: list[float]) -> None:
        gate.wait()
        try:
            for _ in range(n):
                began = time.perf_counter()
                one()
                mine.append((time.perf_counter() - began) * 1000)
        except BaseException as exc:
            errors.append(exc)

    pairs = zip(share, spans, strict=True)
    workers = [threading.Thread(target=loop, args=(n, mine)) for n, mine in pairs]
    for worker in workers:
        worker.start()
    gate.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return Calls(rate(runs, elapsed), tuple(ms for mine in spans for ms in mine))


async def tasked(tasks: int, runs: int, one: Callable[[], Awaitable[Any]]) -> Calls:
    """``runs`` awaits of ``one`` spread over ``tasks`` asyncio tasks started together."""
    share = [runs // tasks + (1 if i < runs % tasks else 0) for i in range(tasks)]
    spans: list[float] = []

    async def loop(n: int) -> None:
        for _ in range(n):
            began = time.perf_counter()
            await one()
            spans.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for n in share:
            group.create_task(loop(n))
    return Calls(rate(runs, time.perf_counter() - began), tuple(spans))


# ---- runfleet ----------------------------------------------------------------------------


def _rf_threaded(settings: Settings, threads: int, runs: int, mode: Mode) -> Calls:
    name = ADMIT_QUEUE if mode is Mode.ENQUEUE else TRIP_QUEUE
    with Queue(name, settings=settings) as queue:
        warm = queue.enqueue(noop_flow)  # connect (and wake the workers) untimed
        if mode is Mode.ROUND_TRIP:
            warm.wait(timeout=RESULT_TIMEOUT)

        def one() -> None:
            job = queue.enqueue(noop_flow)
            if mode is Mode.ROUND_TRIP:
                job.wait(timeout=RESULT_TIMEOUT)

        return threaded(threads, runs, one)


async def _rf_tasked(settings: Settings, tasks: int, runs: int, mode: Mode) -> Calls:
    name = ADMIT_QUEUE if mode is Mode.ENQUEUE else TRIP_QUEUE
    async with AsyncQueue(name, settings=settings) as queue:
        warm = await queue.enqueue(noop_flow)
        if mode is Mode.ROUND_TRIP:
            await warm.wait(timeout=RESULT_TIMEOUT)

        async def one() -> None:
            run = await queue.enqueue(noop_flow)
            if mode is Mode.ROUND_TRIP:
                await run.wait(timeout=RESULT_TIMEOUT)

        return await tasked(tasks, runs, one)


# ---- rq ------------------------------------------------------------------------------------


@contextmanager
def _rq_queues(redis_url: str, workers: int) -> Iterator[tuple[Any, Any]]:
    """An rq queue no worker serves and one ``workers`` idle SimpleWorkers serve, on one
    connection pool the threads share; both deleted on the way out."""
    import redis
    from rq import Queue as RqQueue

    conn = redis.Redis.from_url(redis_url)
    token = secrets.token_hex(4)
    admit = RqQueue(f"rf-bench-rq-admit-{token}", connection=conn)
    trip = RqQueue(f"rf-bench-rq-{token}", connection=conn)
    procs = [rq_side._worker(redis_url, trip.name, burst=False) for _ in range(workers)]
    try:
        rq_side.wait_result(trip.enqueue(noop))
        yield admit, trip
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
        for queue in (admit, trip):
            queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
            queue.delete(delete_jobs=True)
        conn.close()


def _rq_threaded(queues: tuple[Any, Any], threads: int, runs: int, mode: Mode) -> Calls:
    admit, trip = queues
    if mode is Mode.ENQUEUE:
        return threaded(threads, runs, lambda: admit.enqueue(noop))
    return threaded(threads, runs, lambda: rq_side.wait_result(trip.enqueue(noop)))


# ---- Celery --------------------------------------------------------------------------------


def celery_available() -> bool:
    try:
        import celery  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def _celery(redis_url: str, workers: int) -> Iterator[Any]:
    """Celery's app (Redis broker and result backend, late acks) and one prefork worker of
    ``workers`` children serving its queue; every key the run wrote removed afterwards."""
    import redis

    from bench.celery_app import TASK, make_app

    token = secrets.token_hex(4)
    env = {
        "RF_CELERY_REDIS": redis_url,
        "RF_CELERY_QUEUE": f"rf-bench-celery-{token}",
        "RF_CELERY_PREFIX": f"rf-bench-celery-{token}:",
    }
    app = make_app(redis_url, env["RF_CELERY_QUEUE"], env["RF_CELERY_PREFIX"])
    argv = [
        sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
        "--pool", "prefork", "--concurrency", str(workers), "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--queues", env["RF_CELERY_QUEUE"],
    ]  # fmt: skip
    proc = Proc(argv, python_env(env))
    try:
        try:
            app.send_task(TASK).get(timeout=60)
        except Exception as exc:
            raise BenchError(f"celery worker did not answer: {exc}\n{proc.tail()}") from exc
        yield app
    finally:
        proc.terminate()
        proc.close()
        conn = redis.Redis.from_url(redis_url)
        try:
            keys = list(conn.scan_iter(match=f"{env['RF_CELERY_PREFIX']}*", count=1000))
            for start in range(0, len(keys), 1000):
                conn.delete(*keys[start : start + 1000])
        finally:
            conn.close()


def _celery_threaded(app: Any, threads: int, runs: int, mode: Mode) -> Calls:
    from bench.celery_app import TASK

    if mode is Mode.ENQUEUE:
        # To a queue no worker serves, as the other sides' admissions: the round trips
        # that follow never wait behind them.
        idle = f"{app.conf.task_default_queue}-admit"
        return threaded(threads, runs, lambda: app.send_task(TASK, queue=idle))
    return threaded(threads, runs, lambda: app.send_task(TASK).get(timeout=RESULT_TIMEOUT))


# ---- procrastinate -------------------------------------------------------------------------


def _pr_queue(mode: Mode) -> str:
    if mode is Mode.ENQUEUE:
        return procrastinate_side.ADMIT_QUEUE
    return procrastinate_side.TRIP_QUEUE


def _pr_threaded(url: str, threads: int, runs: int, mode: Mode) -> Calls:
    """Threads sharing one sync app: ``defer``, then (round trip) its status polled."""
    with procrastinate_side.sync_app(url) as app:
        task = procrastinate_side.deferrer(app, _pr_queue(mode))
        warm = task.defer()  # connect untimed
        if mode is Mode.ROUND_TRIP:
            procrastinate_side.wait(app, warm)

        def one() -> None:
            job_id = task.defer()
            if mode is Mode.ROUND_TRIP:
                procrastinate_side.wait(app, job_id)

        calls = threaded(threads, runs, one)
    if mode is Mode.ENQUEUE:
        procrastinate_side.clear_admitted(url)
    return calls


async def _pr_tasked(url: str, tasks: int, runs: int, mode: Mode) -> Calls:
    """asyncio tasks sharing one async app: ``defer_async``, then its status polled."""
    async with procrastinate_side.async_app(url) as app:
        task = procrastinate_side.deferrer(app, _pr_queue(mode))
        warm = await task.defer_async()
        if mode is Mode.ROUND_TRIP:
            await procrastinate_side.wait_async(app, warm)

        async def one() -> None:
            job_id = await task.defer_async()
            if mode is Mode.ROUND_TRIP:
                await procrastinate_side.wait_async(app, job_id)

        calls = await tasked(tasks, runs, one)
    if mode is Mode.ENQUEUE:
        await asyncio.to_thread(procrastinate_side.clear_admitted, url)
    return calls


# ---- the whole phase -------------------------------------------------------------------


SYNC_SHAPES = (Shape.ONE_THREAD, Shape.THREADS)


async def run(
    servers: Servers,
    *,
    runs: int = 1000,
    threads: int = 16,
    tasks: int = 64,
    workers: int = 2,
    concurrency: int = 64,
    rounds: int = 3,
    celery: bool = True,
    procrastinate: bool = True,
) -> ShapesResult:
    """Every shape and mode, each round runfleet then rq then Celery then procrastinate;
    scratch databases, queues and keys dropped afterwards. ``celery`` or ``procrastinate``
    False (or the peer not installed) leaves its column out, saying why."""
    if min(runs, threads, tasks, workers, concurrency, rounds) < 1:
        raise BenchError("runs, threads, tasks, workers, concurrency and rounds must be >= 1")
    skipped: dict[System, str] = {}
    if celery and not celery_available():
        skipped[System.CELERY] = "not installed (pip install -e '.[bench]')"
    elif not celery:
        skipped[System.CELERY] = "left out (--skip-celery)"
    if procrastinate and not procrastinate_side.available():
        skipped[System.PROCRASTINATE] = procrastinate_side.PROCRASTINATE_MISSING
    elif not procrastinate:
        skipped[System.PROCRASTINATE] = "left out (--skip-procrastinate)"
    load = os.getloadavg()
    raw: dict[Key, list[Calls]] = {}

    def keep(key: Key, calls: Calls) -> None:
        raw.setdefault(key, []).append(calls)

    sizes = {Shape.ONE_THREAD: 1, Shape.THREADS: threads}
    async with AsyncExitStack() as stack:
        peer = None
        if System.PROCRASTINATE not in skipped:  # its workers idle through the others' rounds
            peer = await stack.enter_async_context(
                procrastinate_side.side(servers.database_url, workers, concurrency)
            )
        url = await stack.enter_async_context(
            scratch_database(servers.database_url, "rf_bench_shapes")
        )
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("shapes")
        )
        procs = [
            runfleet_worker(
                settings, flows="bench.noop", queues=TRIP_QUEUE, concurrency=concurrency
            )
            for _ in range(workers)
        ]
        try:
            await wait_workers_started(settings, procs, timeout=60)
            for _ in range(rounds):
                for mode in Mode:
                    for shape in SYNC_SHAPES:
                        keep((System.RUNFLEET, shape, mode), await asyncio.to_thread(
                            _rf_threaded, settings, sizes[shape], runs, mode))  # fmt: skip
                    keep((System.RUNFLEET, Shape.TASKS, mode),
                         await _rf_tasked(settings, tasks, runs, mode))  # fmt: skip
                await asyncio.to_thread(_peers_round, servers.redis_url, sizes, runs, workers,
                                        System.CELERY not in skipped, keep)  # fmt: skip
                if peer is not None:
                    for mode in Mode:
                        for shape in SYNC_SHAPES:
                            keep((System.PROCRASTINATE, shape, mode), await asyncio.to_thread(
                                _pr_threaded, peer.url, sizes[shape], runs, mode))  # fmt: skip
                        keep((System.PROCRASTINATE, Shape.TASKS, mode),
                             await _pr_tasked(peer.url, tasks, runs, mode))  # fmt: skip
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
            await drop_keys(servers.redis_url, settings.redis_prefix)
    figures = {key: Figure(tuple(calls)) for key, calls in raw.items()}
    return ShapesResult(
        runs, threads, tasks, workers, rounds, figures, load, os.getloadavg(), skipped
    )


def _peers_round(
    redis_url: str,
    sizes: dict[Shape, int],
    runs: int,
    workers: int,
    celery: bool,
    keep: Callable[[Key, Calls], None],
) -> None:
    """One round of rq's and (``celery``) Celery's sync shapes, each with its own workers."""
    with _rq_queues(redis_url, workers) as queues:
        for mode in Mode:
            for shape in SYNC_SHAPES:
                keep((System.RQ, shape, mode), _rq_threaded(queues, sizes[shape], runs, mode))
    if celery:
        with _celery(redis_url, workers) as app:
            for mode in Mode:
                for shape in SYNC_SHAPES:
                    keep((System.CELERY, shape, mode),
                         _celery_threaded(app, sizes[shape], runs, mode))  # fmt: skip


def table(result: ShapesResult) -> Table:
    """One row per shape and mode: each system's rate and its p50 / p99."""
    systems = [s for s in System if s not in result.skipped]
    t = Table(
        title=f"producer shapes: {result.runs} calls per figure, {result.workers} workers a "
        f"side, median of {result.rounds} rounds; load before "
        + " ".join(f"{x:.2f}" for x in result.load_before)
    )
    t.add_column("shape, each call")
    for system in systems:
        t.add_column(f"{system.value} runs/s (p50 / p99 ms)", justify="right")
    for shape in Shape:
        for mode in Mode:
            cells = []
            for system in systems:
                figure = result.figures.get((system, shape, mode))
                cells.append(
                    "-" if figure is None
                    else f"{figure.per_s:,.0f} ({figure.p(50):.1f} / {figure.p(99):.1f})"
                )  # fmt: skip
            t.add_row(f"{result.label(shape)}: {mode.value}", *cells)
    for system, why in result.skipped.items():
        t.add_row(f"{system.value}: {why}", *["" for _ in systems])
    return t
