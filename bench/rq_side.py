"""The rq side of the fleet benchmark: the same no-op, the same Redis, ``SimpleWorker``s.

rq keeps its jobs in Redis only (no durable record beyond Redis persistence), so it is
the speed a Redis-only queue reaches here; runfleet is measured against it with every
run a Postgres row plus journal. Timestamps come from rq's own job hashes
(``enqueued_at``, ``started_at``, ``ended_at``: worker wall clock, microseconds).
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.figures import percentile, rate
from bench.noop import noop
from runfleet.ops.bench.procs import Proc, python_env
from runfleet.ops.bench.scratch import BenchError

RQ_WORKER = "bench.rq_worker.SimpleWorker"
"""rq's ``SimpleWorker``, its command channel polled promptly (bench/rq_worker.py): a
burst worker's exit is not charged rq's teardown stall."""


@dataclass(frozen=True, slots=True)
class Drain:
    """``runs`` executed by ``workers`` processes: wall time from spawn to the last exit,
    and the processing window from the first start to the last finish."""

    runs: int
    wall_s: float
    window_s: float

    @property
    def wall_rate(self) -> float:
        return rate(self.runs, self.wall_s)

    @property
    def window_rate(self) -> float:
        return rate(self.runs, self.window_s)

    def as_json(self) -> dict[str, float]:
        return {
            "runs": self.runs,
            "wall_s": round(self.wall_s, 3),
            "window_s": round(self.window_s, 3),
            "wall_runs_per_s": round(self.wall_rate, 1),
            "window_runs_per_s": round(self.window_rate, 1),
        }


@dataclass(frozen=True, slots=True)
class SideResult:
    """One system's figures in the fleet benchmark."""

    enqueue_single_per_s: float
    enqueue_many_per_s: float
    drain: Drain
    latency_ms: tuple[float, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "enqueue_single_per_s": round(self.enqueue_single_per_s, 1),
            "enqueue_many_per_s": round(self.enqueue_many_per_s, 1),
            "drain": self.drain.as_json(),
            "latency_samples": len(self.latency_ms),
            "latency_p50_ms": round(percentile(self.latency_ms, 50), 3),
            "latency_p99_ms": round(percentile(self.latency_ms, 99), 3),
        }


def _worker(redis_url: str, queue: str, *, burst: bool) -> Proc:
    argv = [
        sys.executable, "-m", "rq.cli", "worker", "--worker-class", RQ_WORKER,
        "--url", redis_url, "--logging_level", "WARNING", "--disable-job-desc-logging",
        *(["--burst"] if burst else []), queue,
    ]  # fmt: skip
    return Proc(argv, python_env())


def _ms(a: datetime | None, b: datetime | None) -> float:
    if a is None or b is None:
        raise BenchError("an rq job has no enqueued/started/ended timestamp")
    return (b - a).total_seconds() * 1000


def run(
    redis_url: str, *, runs: int, workers: int, latency_samples: int, gap_s: float
) -> SideResult:
    """Enqueue singly and in bulk, drain with burst workers, then time idle starts."""
    import redis
    from rq import Queue

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = Queue(name, connection=conn)
    try:
        began = time.perf_counter()
        ids = [queue.enqueue(noop).id for _ in range(runs)]
        single = rate(runs, time.perf_counter() - began)
        batch = [Queue.prepare_data(noop) for _ in range(runs)]
        began = time.perf_counter()
        ids += [job.id for job in queue.enqueue_many(batch)]
        many = rate(runs, time.perf_counter() - began)

        drain = _burst_drain(conn, redis_url, name, ids, workers)
        latency = _latency(conn, queue, name, redis_url, workers, latency_samples, gap_s)
        return SideResult(single, many, drain, latency)
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
        queue.delete(delete_jobs=True)
        conn.close()


def _burst_drain(conn: Any, redis_url: str, name: str, ids: Sequence[str], workers: int) -> Drain:
    """``workers`` burst SimpleWorkers drain the queue; window from rq's own timestamps."""
    from rq.job import Job

    procs = [_worker(redis_url, name, burst=True) for _ in range(workers)]
    began = time.perf_counter()
    try:
        for proc in procs:
            if proc.proc.wait(600) != 0:
                raise BenchError(f"rq worker exited {proc.proc.returncode}:\n{proc.tail()}")
        wall = time.perf_counter() - began
    finally:
        for proc in procs:
            proc.close()
    jobs = [j for j in Job.fetch_many(list(ids), connection=conn) if j is not None]
    finished = [j for j in jobs if j.ended_at is not None]
    if len(finished) != len(ids):
        raise BenchError(f"rq finished {len(finished)} of {len(ids)} jobs")
    first = min(j.started_at for j in finished if j.started_at is not None)
    last = max(j.ended_at for j in finished if j.ended_at is not None)
    return Drain(len(ids), wall, _ms(first, last) / 1000)


def drain(redis_url: str, *, runs: int, workers: int) -> Drain:
    """A standing backlog of ``runs`` no-ops (``enqueue_many``) drained by ``workers``."""
    import redis
    from rq import Queue

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = Queue(name, connection=conn)
    try:
        ids: list[str] = []
        for start in range(0, runs, 1000):
            batch = [Queue.prepare_data(noop) for _ in range(min(1000, runs - start))]
            ids += [job.id for job in queue.enqueue_many(batch)]
        return _burst_drain(conn, redis_url, name, ids, workers)
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
        queue.delete(delete_jobs=True)
        conn.close()


def with_results(
    redis_url: str, *, runs: int, workers: int, samples: int
) -> tuple[float, tuple[float, ...]]:
    """Idle workers; admit ``runs`` in one ``enqueue_many`` and wait for each result in
    turn (``job.latest_result(timeout)``, rq's blocking read): runs/s from admission to
    the last result. Then ``job.return_value(refresh=True)`` on ``samples`` settled jobs:
    ms each."""
    import redis
    from rq import Queue

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = Queue(name, connection=conn)
    procs = [_worker(redis_url, name, burst=False) for _ in range(workers)]
    try:
        warm = [queue.enqueue(noop) for _ in range(workers * 5)]
        _wait_finished(conn, [j.id for j in warm], procs)
        began = time.perf_counter()
        jobs = queue.enqueue_many([Queue.prepare_data(noop) for _ in range(runs)])
        for job in jobs:
            if job.latest_result(timeout=120) is None:
                raise BenchError(f"rq job {job.id} has no result after 120 s")
        per_s = rate(runs, time.perf_counter() - began)
        latency: list[float] = []
        for job in jobs[:samples]:
            began = time.perf_counter()
            job.return_value(refresh=True)
            latency.append((time.perf_counter() - began) * 1000)
        return per_s, tuple(latency)
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()
        queue.empty()  # type: ignore[no-untyped-call]  # rq's Queue.empty is unannotated
        queue.delete(delete_jobs=True)
        conn.close()


def _latency(
    conn: Any, queue: Any, name: str, redis_url: str, workers: int, samples: int, gap_s: float
) -> tuple[float, ...]:
    """Idle workers blocked on the queue; one job at a time; enqueued_at -> started_at."""
    from rq.job import Job

    procs = [_worker(redis_url, name, burst=False) for _ in range(workers)]
    try:
        warm = [queue.enqueue(noop) for _ in range(workers * 5)]
        _wait_finished(conn, [j.id for j in warm], procs)
        ids: list[str] = []
        for _ in range(samples):
            ids.append(queue.enqueue(noop).id)
            time.sleep(gap_s)
        _wait_finished(conn, ids, procs)
        jobs = Job.fetch_many(ids, connection=conn)
        return tuple(_ms(j.enqueued_at, j.started_at) for j in jobs if j is not None)
    finally:
        for proc in procs:
            proc.terminate()
            proc.close()


def _wait_finished(conn: Any, ids: Sequence[str], procs: Sequence[Proc]) -> None:
    from rq.job import Job

    deadline = time.monotonic() + 60
    while True:
        jobs = Job.fetch_many(ids, connection=conn)
        if all(j is not None and j.ended_at is not None for j in jobs):
            return
        for proc in procs:
            if proc.proc.poll() is not None:
                raise BenchError(f"rq worker exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise BenchError("rq jobs did not finish within 60 s")
        time.sleep(0.02)


def wait_result(job: Any, timeout: float = 120) -> None:
    """rq's blocking ``latest_result``, in slices: a loaded box has seen a single long
    XREAD BLOCK end in a socket timeout."""
    import redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if job.latest_result(timeout=2) is not None:
                return
        except redis.exceptions.TimeoutError:
            continue
    raise BenchError(f"rq job {job.id} has no result after {timeout:.0f} s")
