"""``python -m bench producer``: the producer's path as a user writes it, beside its peers.

A web handler enqueues one job per request; a script enqueues in a loop and then calls
``wait()`` on each handle; a threaded or an asyncio service shares one queue among its
threads or tasks (``bench.shapes``). Measured that way, in one invocation on one machine: single
``enqueue`` (no workers), ``enqueue_many``, ``wait()``/``return_value()`` of a settled
run, the loop then ``wait()`` of each with two idle worker processes each side (no-op
jobs against rq ``SimpleWorker``s; three-step durable flows against DBOS executors on the
same Postgres), and the idle enqueue -> start latency (rq's ``enqueued_at`` ->
``started_at``; procrastinate's ``deferred`` -> ``started`` events, ``bench.procrastinate_side``).
Every runfleet run is durable before ``enqueue`` returns (row and ``created`` record
committed), on the server as found.

Rounds alternate runfleet and its peer (``--rounds``) and each figure is the median of
its rounds, so a burst of load from elsewhere falls on both sides alike.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from rich.table import Table

from bench import dbos_side, procrastinate_side, rq_side, shapes
from bench.drain import drop_keys
from bench.figures import percentile, rate
from bench.noop import QUEUE, noop, noop_flow
from bench.servers import Servers, bench_prefix
from bench.shapes import ShapesResult
from runfleet.ops.bench.procs import Proc, runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError, scratch_database
from runfleet.ops.bench.three_steps import QUEUE as FLOWS_QUEUE
from runfleet.ops.bench.three_steps import three_steps
from runfleet.producer import EnqueueSpec
from runfleet.rqface import Queue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.queries import q

TARGETS: dict[str, float] = {
    "single enqueue >= 1x rq": 1.0,
    "single enqueue >= 0.6x rq (the floor)": 0.6,
    "enqueue_many >= 1.5x rq": 1.5,
    "loop of enqueue then wait(), no-op jobs >= 3x rq": 3.0,
    "loop of enqueue then wait(), three-step flows >= 4x DBOS": 4.0,
}
"""The ratios the run reports as targets, every side in one invocation."""

ADMIT_QUEUE = "bench-admit"
"""The admission phases' queue: no worker serves it, so the runs they admit never become
a backlog in front of the loop or the idle starts (whose lost-wake sweeps would re-wake
them all on the streams those read)."""


@dataclass(frozen=True, slots=True)
class Side:
    """One system's figures: medians over rounds (per-call samples pooled)."""

    single_per_s: float
    many_per_s: float
    loop_per_s: float
    settled_read_ms: tuple[float, ...] = ()
    start_ms: tuple[float, ...] = ()
    return_value_ms: tuple[float, ...] = ()

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "single_enqueue_per_s": round(self.single_per_s, 1),
            "enqueue_many_per_s": round(self.many_per_s, 1),
            "loop_then_result_per_s": round(self.loop_per_s, 1),
        }
        for name, values in (
            ("settled_result", self.settled_read_ms),
            ("settled_return_value", self.return_value_ms),
            ("idle_start", self.start_ms),
        ):
            if values:
                out[f"{name}_p50_ms"] = round(percentile(values, 50), 3)
                out[f"{name}_p99_ms"] = round(percentile(values, 99), 3)
                out[f"{name}_samples"] = len(values)
        return out


@dataclass(frozen=True, slots=True)
class StartParts:
    """Where runfleet's idle starts went, and what a wake from idle costs this machine.

    ``to_wake_ms``: the row's ``created_at_ms`` to its wake's stream entry id (Redis's
    clock, in ms: the rest of the admission statement, its commit, the reply and the
    producer's ``XADD``);
    ``wake_to_claim_ms``: that entry to the activation record (the doorbell, the group
    read and the claim statement up to its timestamp). Both on the one host's clocks, at
    millisecond resolution. ``commit_ms``/``xadd_ms``: p50 of a one-row insert with its
    commit on the bench's Postgres and of an ``XADD`` on its Redis, back to back and
    after the idle starts' own gap: the price of each hop when the processes on both
    ends have gone idle, as they have between idle starts.
    """

    to_wake_ms: tuple[float, ...] = ()
    wake_to_claim_ms: tuple[float, ...] = ()
    commit_ms: tuple[float, float] = (0.0, 0.0)
    xadd_ms: tuple[float, float] = (0.0, 0.0)
    gap_ms: float = 0.0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gap_ms": self.gap_ms}
        for name, values in (
            ("to_wake", self.to_wake_ms),
            ("wake_to_claim", self.wake_to_claim_ms),
        ):
            if values:
                out[f"{name}_p50_ms"] = round(percentile(values, 50), 3)
                out[f"{name}_p99_ms"] = round(percentile(values, 99), 3)
                out[f"{name}_samples"] = len(values)
        out["commit_back_to_back_p50_ms"] = round(self.commit_ms[0], 3)
        out["commit_after_gap_p50_ms"] = round(self.commit_ms[1], 3)
        out["xadd_back_to_back_p50_ms"] = round(self.xadd_ms[0], 3)
        out["xadd_after_gap_p50_ms"] = round(self.xadd_ms[1], 3)
        return out


@dataclass(frozen=True, slots=True)
class ProducerBenchResult:
    runs: int
    flows: int
    workers: int
    rounds: int
    runfleet: Side
    rq: Side
    runfleet_flows_per_s: float
    dbos_flows_per_s: float | None
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    raw: dict[str, list[float]] = field(default_factory=dict)
    start_parts: StartParts = field(default_factory=StartParts)
    shapes: ShapesResult | None = None
    procrastinate_start_ms: tuple[float, ...] | None = None
    """procrastinate's idle starts; None when it was left out."""

    def ratio(self, name: str) -> float:
        mine, theirs = getattr(self.runfleet, name), getattr(self.rq, name)
        return float(mine / theirs) if theirs else float("inf")

    @property
    def flows_ratio(self) -> float | None:
        if not self.dbos_flows_per_s:
            return None
        return self.runfleet_flows_per_s / self.dbos_flows_per_s

    def targets(self) -> dict[str, tuple[str, bool]]:
        """Each target: (what was measured, met?)."""
        measured = {
            "single enqueue >= 1x rq": self.ratio("single_per_s"),
            "single enqueue >= 0.6x rq (the floor)": self.ratio("single_per_s"),
            "enqueue_many >= 1.5x rq": self.ratio("many_per_s"),
            "loop of enqueue then wait(), no-op jobs >= 3x rq": self.ratio("loop_per_s"),
        }
        flows = self.flows_ratio
        if flows is not None:
            measured["loop of enqueue then wait(), three-step flows >= 4x DBOS"] = flows
        found = {
            name: (f"{measured[name]:.2f}x", measured[name] >= floor)
            for name, floor in TARGETS.items()
            if name in measured
        }
        rf = self.runfleet
        read = percentile(rf.settled_read_ms, 50)
        found["wait() of a settled run p50 <= 0.5 ms"] = (f"{read:.3f} ms", read <= 0.5)
        p50, p99 = percentile(rf.start_ms, 50), percentile(rf.start_ms, 99)
        found["idle enqueue -> start p50 <= 3 ms"] = (f"{p50:.1f} ms", p50 <= 3)
        found["idle enqueue -> start p99 <= 6 ms"] = (f"{p99:.1f} ms", p99 <= 6)
        return found

    def as_json(self) -> dict[str, Any]:
        flows = self.flows_ratio
        return {
            "benchmark": "producer",
            "runs": self.runs,
            "flows": self.flows,
            "workers": self.workers,
            "rounds": self.rounds,
            "load_average_before": list(self.load_before),
            "load_average_after": list(self.load_after),
            "runfleet": self.runfleet.as_json(),
            "rq": self.rq.as_json(),
            "procrastinate": None
            if self.procrastinate_start_ms is None
            else {
                "idle_start_p50_ms": round(percentile(self.procrastinate_start_ms, 50), 3),
                "idle_start_p99_ms": round(percentile(self.procrastinate_start_ms, 99), 3),
                "idle_start_samples": len(self.procrastinate_start_ms),
            },
            "flows_loop": {
                "runfleet_per_s": round(self.runfleet_flows_per_s, 1),
                "dbos_per_s": None
                if self.dbos_flows_per_s is None
                else round(self.dbos_flows_per_s, 1),
            },
            "ratios": {
                "single_enqueue": round(self.ratio("single_per_s"), 3),
                "enqueue_many": round(self.ratio("many_per_s"), 3),
                "loop_then_result": round(self.ratio("loop_per_s"), 3),
                "flows_loop_vs_dbos": None if flows is None else round(flows, 3),
            },
            "idle_start_parts": self.start_parts.as_json(),
            "shapes": None if self.shapes is None else self.shapes.as_json(),
            "rounds_raw": {k: [round(v, 1) for v in vs] for k, vs in self.raw.items()},
            "targets": {k: {"measured": v[0], "met": v[1]} for k, v in self.targets().items()},
        }


def _timed(n: int, one: Callable[[], Any]) -> float:
    began = time.perf_counter()
    for _ in range(n):
        one()
    return rate(n, time.perf_counter() - began)


def _samples(items: Sequence[Any], read: Callable[[Any], Any]) -> list[float]:
    out: list[float] = []
    for item in items:
        began = time.perf_counter()
        read(item)
        out.append((time.perf_counter() - began) * 1000)
    return out


# ---- runfleet --------------------------------------------------------------------


def _rf_admission(settings: Settings, runs: int) -> tuple[float, float]:
    """Single enqueues (one call each, no workers), then one ``enqueue_many``."""
    with Queue(ADMIT_QUEUE, settings=settings) as queue:
        queue.enqueue(noop_flow)  # connect outside the timed part
        single = _timed(runs, lambda: queue.enqueue(noop_flow))
        specs = [EnqueueSpec(noop_flow) for _ in range(runs)]
        began = time.perf_counter()
        queue.enqueue_many(specs)
        return single, rate(runs, time.perf_counter() - began)


def _rf_loop(
    settings: Settings, queue_name: str, target: Any, runs: int
) -> tuple[float, list[str]]:
    """The user's script: ``enqueue`` in a loop, then ``wait()`` for each handle."""
    with Queue(queue_name, settings=settings) as queue:
        warm = [queue.enqueue(target, *_args(target, i)) for i in range(10)]
        for job in warm:
            job.wait(timeout=120)
        began = time.perf_counter()
        jobs = [queue.enqueue(target, *_args(target, i)) for i in range(runs)]
        for job in jobs:
            job.wait(timeout=120)
        return rate(runs, time.perf_counter() - began), [j.id for j in jobs]


def _args(target: Any, i: int) -> tuple[Any, ...]:
    return (i,) if target is three_steps else ()


def _rf_settled_reads(settings: Settings, ids: Sequence[str]) -> tuple[list[float], list[float]]:
    with Queue(QUEUE, settings=settings) as queue:
        jobs = [queue.fetch(i) for i in ids]
        jobs[0].wait(timeout=5)  # connect
        results = _samples(jobs, lambda j: j.wait(timeout=5))
        values = _samples(jobs, lambda j: j.return_value(refresh=True))
        return results, values


def _rf_spaced(settings: Settings, count: int, gap_s: float) -> list[str]:
    with Queue(QUEUE, settings=settings) as queue:
        queue.enqueue(noop_flow)
        ids: list[str] = []
        for _ in range(count):
            ids.append(queue.enqueue(noop_flow).id)
            time.sleep(gap_s)
        for run_id in ids:
            queue.fetch(run_id).wait(timeout=120)
        return ids


async def _rf_start_latency(
    settings: Settings, store: Store, count: int, gap_s: float
) -> tuple[list[float], StartParts]:
    """``created_at_ms`` to the ``claimed-and-activated`` record: database time both ends;
    with the wake's stream entry between them and the machine's hop costs."""
    ids = await asyncio.to_thread(_rf_spaced, settings, count, gap_s)
    rows = {row.id: row for row in await store.runs.get_many(ids)}
    records = await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED, after_seq=0)
    activated = {r.run_id: r.at_ms for r in records}
    missing = [i for i in ids if i not in activated]
    if missing:
        raise BenchError(f"{len(missing)} latency runs have no activation record")
    woken = await asyncio.to_thread(_wake_stamps, settings, QUEUE)
    stamped = [i for i in ids if i in woken]
    commit_ms, xadd_ms = await asyncio.to_thread(_hop_costs, settings, gap_s)
    parts = StartParts(
        to_wake_ms=tuple(float(woken[i] - rows[i].created_at_ms) for i in stamped),
        wake_to_claim_ms=tuple(float(activated[i] - woken[i]) for i in stamped),
        commit_ms=commit_ms,
        xadd_ms=xadd_ms,
        gap_ms=gap_s * 1000,
    )
    return [float(activated[i] - rows[i].created_at_ms) for i in ids], parts


def _wake_stamps(settings: Settings, queue: str) -> dict[str, int]:
    """Each run's first wake on ``queue``'s normal lane: its entry id's milliseconds."""
    import redis

    from runfleet.broker.codec import FIELD, MalformedMessage, decode
    from runfleet.broker.keys import Keys

    client = redis.Redis.from_url(settings.redis_url)
    try:
        stamps: dict[str, int] = {}
        entries = cast(  # redis-py types a sync reply as a union with its async form
            list[tuple[bytes, dict[bytes, bytes]]],
            client.xrange(Keys(settings.redis_prefix).stream(queue)),
        )
        for entry_id, fields in entries:
            try:
                run = decode(fields[FIELD]).run
            except (KeyError, MalformedMessage):
                continue
            stamps.setdefault(run, int(entry_id.split(b"-")[0]))
        return stamps
    finally:
        client.close()


HOPS = 100
"""Samples of each hop cost, back to back and after the idle starts' gap."""


def _hop_costs(settings: Settings, gap_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """p50 of a one-row insert with its commit and of an ``XADD``, back to back and after
    ``gap_s`` idle: (back to back, after the gap) for each."""
    import psycopg
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    key = f"{settings.redis_prefix}bench-hops"
    try:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(q("bench.hops_table"))
            try:
                commit = [_hop(lambda: conn.execute(q("bench.hops_insert")), pause)
                          for pause in (0.0, gap_s)]  # fmt: skip
                xadd = [_hop(lambda: client.xadd(key, {"x": "1"}, maxlen=HOPS), pause)
                        for pause in (0.0, gap_s)]  # fmt: skip
            finally:
                conn.execute(q("bench.hops_drop"))
        return (commit[0], commit[1]), (xadd[0], xadd[1])
    finally:
        client.delete(key)
        client.close()


def _hop(one: Callable[[], Any], pause: float) -> float:
    spans: list[float] = []
    for _ in range(HOPS):
        if pause:
            time.sleep(pause)
        began = time.perf_counter()
        one()
        spans.append((time.perf_counter() - began) * 1000)
    return percentile(spans, 50)


def _workers(settings: Settings, flows: str, queue: str, workers: int, k: int) -> list[Proc]:
    return [
        runfleet_worker(settings, flows=flows, queues=queue, concurrency=k) for _ in range(workers)
    ]


# ---- rq ----------------------------------------------------------------------------


def _rq_round(redis_url: str, runs: int, workers: int, samples: int) -> tuple[Side, list[float]]:
    """rq's admission rates, the loop then ``latest_result`` with ``workers`` SimpleWorkers
    (burst off), and ``return_value(refresh=True)`` of settled jobs."""
    import redis
    from rq import Queue as RqQueue

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = RqQueue(name, connection=conn)
    try:
        single = _timed(runs, lambda: queue.enqueue(noop))
        queue.empty()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
        began = time.perf_counter()
        queue.enqueue_many([RqQueue.prepare_data(noop) for _ in range(runs)])
        many = rate(runs, time.perf_counter() - began)
        queue.empty()  # type: ignore[no-untyped-call]  # rq's Queue.empty is unannotated
        procs = [rq_side._worker(redis_url, name, burst=False) for _ in range(workers)]
        try:
            for job in [queue.enqueue(noop) for _ in range(10)]:
                rq_side.wait_result(job)
            began = time.perf_counter()
            jobs = [queue.enqueue(noop) for _ in range(runs)]
            for job in jobs:
                rq_side.wait_result(job)
            loop = rate(runs, time.perf_counter() - began)
            reads = _samples(jobs[:samples], lambda j: j.return_value(refresh=True))
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
        return Side(single, many, loop, tuple(reads), (), tuple(reads)), reads
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq's Queue.empty is unannotated
        queue.delete(delete_jobs=True)
        conn.close()


def _rq_latency(redis_url: str, workers: int, samples: int, gap_s: float) -> list[float]:
    import redis
    from rq import Queue as RqQueue

    conn = redis.Redis.from_url(redis_url)
    name = f"rf-bench-rq-{secrets.token_hex(4)}"
    queue = RqQueue(name, connection=conn)
    try:
        return list(rq_side._latency(conn, queue, name, redis_url, workers, samples, gap_s))
    finally:
        queue.empty()  # type: ignore[no-untyped-call]  # rq's Queue.empty is unannotated
        queue.delete(delete_jobs=True)
        conn.close()


# ---- DBOS --------------------------------------------------------------------------


async def _dbos_loop(admin_url: str, flows: int, workers: int, k: int, polling: float) -> float:
    """DBOS's user loop: ``DBOSClient.enqueue`` per flow, then ``get_result()`` of each."""
    from dbos import DBOSClient

    from bench.dbos_app import APP, VERSION, WORKFLOW
    from bench.dbos_app import QUEUE as DBOS_QUEUE

    async with scratch_database(admin_url, "rf_bench_dbos") as url:
        url = url if "://" in url else dbos_side._as_url(url)
        procs = [dbos_side._executor(url, k, polling) for _ in range(1)]
        try:
            await dbos_side._ready(procs)  # the first creates the schema
            procs += [dbos_side._executor(url, k, polling) for _ in range(workers - 1)]
            await dbos_side._ready(procs)
            client: Any = DBOSClient(system_database_url=url, application_name=APP)
            options: Any = {"queue_name": DBOS_QUEUE, "workflow_name": WORKFLOW,
                            "app_version": VERSION}  # fmt: skip

            def loop() -> float:
                warm: list[Any] = [client.enqueue(options, i) for i in range(10)]
                for h in warm:
                    h.get_result()
                began = time.perf_counter()
                handles: list[Any] = [client.enqueue(options, i) for i in range(flows)]
                for handle in handles:
                    handle.get_result()
                return rate(flows, time.perf_counter() - began)

            try:
                return await asyncio.to_thread(loop)
            finally:
                client.destroy()
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()


# ---- the flows phase alone (``--only flows``) ------------------------------------------


@dataclass(frozen=True, slots=True)
class FlowsLoopResult:
    """The three-step flows loop alone, runfleet and DBOS alternated round by round."""

    flows: int
    workers: int
    runfleet_rounds: list[float]
    dbos_rounds: list[float]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def ratio(self) -> float | None:
        if not self.dbos_rounds:
            return None
        return statistics.median(self.runfleet_rounds) / statistics.median(self.dbos_rounds)

    def as_json(self) -> dict[str, Any]:
        ratio = self.ratio
        target = "loop of enqueue then wait(), three-step flows >= 4x DBOS"
        return {
            "benchmark": "producer",
            "only": "flows",
            "flows": self.flows,
            "workers": self.workers,
            "load_average_before": list(self.load_before),
            "load_average_after": list(self.load_after),
            "flows_loop": {
                "runfleet_per_s": round(statistics.median(self.runfleet_rounds), 1),
                "dbos_per_s": round(statistics.median(self.dbos_rounds), 1)
                if self.dbos_rounds
                else None,
            },
            "ratios": {"flows_loop_vs_dbos": None if ratio is None else round(ratio, 3)},
            "rounds_raw": {
                "runfleet.flows_loop": [round(v, 1) for v in self.runfleet_rounds],
                "dbos.flows_loop": [round(v, 1) for v in self.dbos_rounds],
            },
            "targets": {}
            if ratio is None
            else {target: {"measured": f"{ratio:.2f}x", "met": ratio >= TARGETS[target]}},
        }


async def run_flows_only(
    servers: Servers,
    *,
    flows: int = 300,
    workers: int = 2,
    concurrency: int = 32,
    rounds: int = 3,
    dbos_polling: float = 0.05,
    skip_dbos: bool = False,
) -> FlowsLoopResult:
    """The loop of enqueue then ``wait()`` of three-step flows, each round runfleet then
    DBOS (the full run measures every DBOS round after the runfleet ones)."""
    if min(flows, workers, concurrency, rounds) < 1:
        raise BenchError("flows, workers, concurrency and rounds must be >= 1")
    if not skip_dbos and not dbos_side.available():
        raise BenchError(dbos_side.DBOS_MISSING)
    load = os.getloadavg()
    ours: list[float] = []
    theirs: list[float] = []
    async with scratch_database(servers.database_url, "rf_bench_producer") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("producer")
        )
        procs = _workers(
            settings, "runfleet.ops.bench.three_steps", FLOWS_QUEUE, workers, concurrency
        )
        try:
            await wait_workers_started(settings, procs, timeout=60)
            for _ in range(rounds):
                per_s, _ids = await asyncio.to_thread(
                    _rf_loop, settings, FLOWS_QUEUE, three_steps, flows
                )
                ours.append(per_s)
                if not skip_dbos:
                    theirs.append(
                        await _dbos_loop(
                            servers.database_url, flows, workers, concurrency, dbos_polling
                        )
                    )
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
            await drop_keys(servers.redis_url, settings.redis_prefix)
    return FlowsLoopResult(flows, workers, ours, theirs, load, os.getloadavg())


def flows_table(result: FlowsLoopResult) -> Table:
    """The table ``producer --only flows`` prints."""
    t = Table(
        title=f"producer --only flows: {result.flows} flows, {result.workers} workers each, "
        f"{len(result.runfleet_rounds)} rounds alternated; load before "
        + " ".join(f"{x:.2f}" for x in result.load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in result.load_after)
    )
    for col in ("", "runfleet", "DBOS", "ratio"):
        t.add_column(col, justify="left" if not col else "right")
    ratio = result.ratio
    t.add_row(
        "the loop, three-step flows (flows/s), median",
        f"{statistics.median(result.runfleet_rounds):,.0f}",
        f"{statistics.median(result.dbos_rounds):,.0f}" if result.dbos_rounds else "-",
        "-" if ratio is None else f"{ratio:.2f}x",
    )
    t.add_row(
        "rounds",
        " ".join(f"{v:.0f}" for v in result.runfleet_rounds),
        " ".join(f"{v:.0f}" for v in result.dbos_rounds),
        "",
    )
    return t


# ---- the whole benchmark ----------------------------------------------------------


async def run(
    servers: Servers,
    *,
    runs: int = 1000,
    flows: int = 300,
    workers: int = 2,
    concurrency: int = 32,
    samples: int = 200,
    gap_s: float = 0.02,
    rounds: int = 3,
    dbos_polling: float = 0.05,
    skip_dbos: bool = False,
    threads: int = 16,
    tasks: int = 64,
    skip_shapes: bool = False,
    skip_celery: bool = False,
    skip_procrastinate: bool = False,
) -> ProducerBenchResult:
    """Every phase, rounds alternating runfleet and rq; procrastinate's idle starts (unless
    ``skip_procrastinate`` or not installed); then the producer shapes (``bench.shapes``:
    ``threads`` threads, ``tasks`` asyncio tasks, beside rq, Celery and procrastinate)
    unless ``skip_shapes``; scratch databases dropped after."""
    if min(runs, flows, workers, concurrency, samples, rounds) < 1:
        raise BenchError("runs, flows, workers, concurrency, samples and rounds must be >= 1")
    if not skip_dbos and not dbos_side.available():
        raise BenchError(dbos_side.DBOS_MISSING)
    load = os.getloadavg()
    raw: dict[str, list[float]] = {}

    def keep(key: str, value: float) -> None:
        raw.setdefault(key, []).append(value)

    rq_reads: list[float] = []
    async with scratch_database(servers.database_url, "rf_bench_producer") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("producer")
        )
        store = await Store.open(settings, min_size=1, max_size=2)
        procs: list[Proc] = []
        try:
            for _ in range(rounds):
                single, many = await asyncio.to_thread(_rf_admission, settings, runs)
                keep("runfleet.single_enqueue", single)
                keep("runfleet.enqueue_many", many)
                theirs, reads = await asyncio.to_thread(
                    _rq_round, servers.redis_url, runs, workers, samples
                )
                keep("rq.single_enqueue", theirs.single_per_s)
                keep("rq.enqueue_many", theirs.many_per_s)
                keep("rq.loop_then_result", theirs.loop_per_s)
                rq_reads += reads
                # The loop's workers serve a queue of their own (the same flow).
                if not procs:
                    procs = _workers(settings, "bench.noop", "bench-loop", workers, concurrency)
                    procs += _workers(
                        settings,
                        "runfleet.ops.bench.three_steps",
                        FLOWS_QUEUE,
                        workers,
                        concurrency,
                    )
                    await wait_workers_started(settings, procs, timeout=60)
                loop, ids = await asyncio.to_thread(
                    _rf_loop, settings, "bench-loop", noop_flow, runs
                )
                keep("runfleet.loop_then_result", loop)
            results, values = await asyncio.to_thread(_rf_settled_reads, settings, ids[:samples])
            flows_rf: list[float] = []
            for _ in range(rounds):
                per_s, _ids = await asyncio.to_thread(
                    _rf_loop, settings, FLOWS_QUEUE, three_steps, flows
                )
                flows_rf.append(per_s)
            raw["runfleet.flows_loop"] = flows_rf
            for proc in procs:  # the idle start: fresh no-op workers on the admitted queue
                proc.terminate()
                proc.close()
            procs = _workers(settings, "bench.noop", QUEUE, workers, concurrency)
            await wait_workers_started(settings, procs, timeout=60)
            starts, parts = await _rf_start_latency(settings, store, samples, gap_s)
        finally:
            for proc in procs:
                proc.terminate()
                proc.close()
            await store.close()
            await drop_keys(servers.redis_url, settings.redis_prefix)
    rq_starts = await asyncio.to_thread(_rq_latency, servers.redis_url, workers, samples, gap_s)
    pr_starts: tuple[float, ...] | None = None
    if not skip_procrastinate and procrastinate_side.available():
        pr_starts = tuple(await procrastinate_side.idle_starts(
            servers.database_url, workers, concurrency, samples, gap_s))  # fmt: skip
    dbos: float | None = None
    if not skip_dbos:
        dbos_rounds = [
            await _dbos_loop(servers.database_url, flows, workers, concurrency, dbos_polling)
            for _ in range(rounds)
        ]
        raw["dbos.flows_loop"] = dbos_rounds
        dbos = statistics.median(dbos_rounds)
    shaped = None
    if not skip_shapes:
        shaped = await shapes.run(
            servers, runs=runs, threads=threads, tasks=tasks, workers=workers,
            concurrency=concurrency, rounds=rounds, celery=not skip_celery,
            procrastinate=not skip_procrastinate,
        )  # fmt: skip
    med = {k: statistics.median(v) for k, v in raw.items()}
    ours = Side(
        med["runfleet.single_enqueue"], med["runfleet.enqueue_many"],
        med["runfleet.loop_then_result"], tuple(results), tuple(starts), tuple(values),
    )  # fmt: skip
    theirs = Side(
        med["rq.single_enqueue"], med["rq.enqueue_many"], med["rq.loop_then_result"],
        tuple(rq_reads), tuple(rq_starts), tuple(rq_reads),
    )  # fmt: skip
    return ProducerBenchResult(
        runs, flows, workers, rounds, ours, theirs, med["runfleet.flows_loop"], dbos, load,
        os.getloadavg(), raw, parts, shaped, pr_starts,
    )  # fmt: skip


def table(result: ProducerBenchResult) -> Table:
    """The side-by-side table the ``producer`` command prints."""
    rf, rq = result.runfleet, result.rq
    title = (
        f"producer: {result.runs} runs, {result.flows} flows, {result.workers} workers each, "
        f"median of {result.rounds} rounds; load before "
        + " ".join(f"{x:.2f}" for x in result.load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in result.load_after)
    )
    t = Table(title=title)
    for col, justify in (
        ("", "left"),
        ("runfleet", "right"),
        ("peer", "right"),
        ("ratio", "right"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]  # justify is one of rich's JustifyMethod literals, typed str here
    for label, name in (
        ("single enqueue, one call each (runs/s) vs rq", "single_per_s"),
        ("enqueue_many (runs/s) vs rq", "many_per_s"),
        ("loop of enqueue, then wait() of each (runs/s) vs rq", "loop_per_s"),
    ):
        t.add_row(label, f"{getattr(rf, name):,.0f}", f"{getattr(rq, name):,.0f}",
                  f"{result.ratio(name):.2f}x")  # fmt: skip
    flows = result.flows_ratio
    t.add_row(
        "the loop, three-step flows (flows/s) vs DBOS",
        f"{result.runfleet_flows_per_s:,.0f}",
        "-" if result.dbos_flows_per_s is None else f"{result.dbos_flows_per_s:,.0f}",
        "-" if flows is None else f"{flows:.2f}x",
    )
    for pct in (50, 99):
        t.add_row(
            f"wait() of a settled run p{pct} (ms) vs rq return_value(refresh=True)",
            f"{percentile(rf.settled_read_ms, pct):.3f}",
            f"{percentile(rq.settled_read_ms, pct):.3f}",
            "",
        )
    for pct in (50, 99):
        t.add_row(
            f"idle enqueue -> start p{pct} (ms) vs rq",
            f"{percentile(rf.start_ms, pct):.1f}",
            f"{percentile(rq.start_ms, pct):.1f}",
            "",
        )
    parts = result.start_parts
    for label, values in (
        ("  of it: created -> wake's XADD", parts.to_wake_ms),
        ("  of it: wake's XADD -> claimed", parts.wake_to_claim_ms),
    ):
        if values:
            spread = f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f}"
            t.add_row(f"{label} p50 / p99 (ms)", spread, "", "")
    gap = f"{parts.gap_ms:.0f} ms"
    t.add_row(f"hop: insert+commit p50 (ms), back to back / after {gap} idle",
              f"{parts.commit_ms[0]:.3f} / {parts.commit_ms[1]:.3f}", "", "")  # fmt: skip
    t.add_row(f"hop: XADD p50 (ms), back to back / after {gap} idle",
              f"{parts.xadd_ms[0]:.3f} / {parts.xadd_ms[1]:.3f}", "", "")  # fmt: skip
    if result.procrastinate_start_ms is not None:
        for pct in (50, 99):
            t.add_row(
                f"idle enqueue -> start p{pct} (ms) vs procrastinate (deferred -> started)",
                f"{percentile(rf.start_ms, pct):.1f}",
                f"{percentile(result.procrastinate_start_ms, pct):.1f}",
                "",
            )
    for name, (measured, met) in result.targets().items():
        t.add_row(f"target: {name}", measured, "", "met" if met else "MISSED")
    return t
