"""One failover: a fleet on a Patroni cluster, producers enqueueing, the primary killed.

Two worker processes connect with the cluster's libpq multi-host URL
(``host=a,b target_session_attrs=read-write``); a backlog of five-step flows is admitted
first and two producers keep admitting more, each with its own run ids, through the
kill. What it reports, measured against the ledger outside the cluster:

- ``lost``: admissions a producer saw committed that the surviving primary lacks;
- ``forgotten``: step executions after runfleet had acknowledged the step's record to
  the flow (a recorded step executed again);
- ``first_claim_s``: from the kill to the first step of a run claimed anew (an epoch
  not seen before the kill); ``full_throughput_s``: to the first second whose step
  rate is back to 80 % of the rate before the kill;
- ``enqueue_per_s`` (one producer, one admission at a time, before the fleet starts)
  and ``steps_per_s`` (the fleet's rate before the kill): what the replication mode
  costs.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

import tests.ha.flows as hf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.errors import Unavailable
from runfleet.store.migrate import migrate
from tests.fleet.procs import WorkerProc
from tests.servers.patroni import PatroniCluster

FLOWS = "tests.ha.flows"
WARM = 100
BACKLOG = 150
PRODUCERS = 2
PACE = 0.05
"""A producer's pause between two admissions. Producers start once a third of the
backlog's steps ran, the kill lands after each has admitted a few, and they go on until
2 s after the failover (or PER_PRODUCER): admissions just before the kill, and during."""
PER_PRODUCER = 100
BUDGET = 40.0
"""Producers' ``RUNFLEET_PRODUCER_RETRY_FOR``: longer than a failover (about TTL s)."""


@dataclass
class Failover:
    admitted: int
    lost: list[str]
    statuses: Counter[str]
    settled_twice: dict[str, int]
    forgotten: list[tuple[str, int]]
    unavailable_after: list[float]
    short_budget_after: float | None
    """A producer with a budget shorter than the outage, calling during it: seconds
    until it raised ``Unavailable`` (None: not probed; -1: it did not raise)."""
    in_flight_at_kill: int
    promoted: str
    first_claim_s: float | None
    full_throughput_s: float | None
    enqueue_per_s: float
    steps_per_s: float
    seconds: float
    failures: list[str] = field(default_factory=list)


async def _rows(
    url: str, sql: str, params: tuple[object, ...] | None = None
) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows: list[tuple[object, ...]] = await (await conn.execute(sql, params)).fetchall()
        return rows


async def _poll(url: str, sql: str) -> list[tuple[object, ...]] | None:
    try:
        return await _rows(url, sql)
    except psycopg.OperationalError:
        return None


async def _count(url: str, sql: str) -> int:
    found = await _poll(url, sql)
    return int(str(found[0][0])) if found else 0


async def _producer(
    settings: Settings,
    name: str,
    acked: dict[str, float],
    unavailable: list[float],
    stop: asyncio.Event,
) -> None:
    async with AsyncQueue("default", settings=settings) as queue:
        for i in range(PER_PRODUCER):
            if stop.is_set():
                return
            run_id = f"{name}-{i}"
            started = time.monotonic()
            try:
                await queue.enqueue(hf.five_steps, i, run_id=run_id)
            except Unavailable:
                unavailable.append(time.monotonic() - started)
                continue
            acked[run_id] = time.time()
            await asyncio.sleep(PACE)


async def _short_budget_call(queue: AsyncQueue) -> float:
    """Seconds until an admission during the outage raised ``Unavailable``; -1 if it
    succeeded. The queue is connected before the kill: a queue's first connect waits
    for its pool (up to 30 s) whatever the budget."""
    started = time.monotonic()
    try:
        await queue.enqueue(hf.five_steps, 0, run_id="short-budget")
    except Unavailable:
        return round(time.monotonic() - started, 2)
    return -1.0


async def _measure_enqueue(settings: Settings, count: int = WARM) -> float:
    async with AsyncQueue("default", settings=settings) as queue:
        started = time.monotonic()
        for i in range(count):
            await queue.enqueue(hf.five_steps, i, run_id=f"warm-{i}")
        return count / (time.monotonic() - started)


async def run_failover(
    settings: Settings,
    cluster: PatroniCluster,
    ledger_url: str,
    kill: Callable[[PatroniCluster], tuple[float, str]],
    *,
    timeout: float = 120,
    short_budget: tuple[float, float] | None = None,
) -> Failover:
    """``kill`` breaks the primary: the time it did, and the member primary after.

    ``short_budget`` ``(delay, budget)``: ``delay`` s after the kill starts, one more
    producer with ``RUNFLEET_PRODUCER_RETRY_FOR=budget`` admits a run.
    """
    started = time.monotonic()
    url = cluster.url()
    await migrate(url)
    ours = settings.model_copy(
        update={
            "database_url": url,
            "heartbeat_interval": 0.25,
            "stale_after": 2.0,
            "sweep_interval": 0.25,
            "producer_retry_for": BUDGET,
        }
    )
    enqueue_per_s = await _measure_enqueue(ours)
    acked: dict[str, float] = {f"warm-{i}": time.time() for i in range(WARM)}
    workers = [
        WorkerProc(ours, flows=FLOWS, concurrency=25, ha_ledger_url=ledger_url) for _ in range(2)
    ]
    unavailable: list[float] = []
    try:
        for w in workers:
            await w.wait_started()
        async with AsyncQueue("default", settings=ours) as queue:
            backlog = await queue.enqueue_many(
                [EnqueueSpec(hf.five_steps, (i,), run_id=f"b-{i}") for i in range(BACKLOG)]
            )
        acked.update({h.id: time.time() for h in backlog})
        ledger_steps = "SELECT count(*) FROM ha_ledger WHERE what = 'exec'"
        deadline = time.monotonic() + 90
        while await _count(ledger_url, ledger_steps) < (WARM + BACKLOG) * hf.STEPS // 3:
            assert time.monotonic() < deadline, "the fleet never got a third through"
            await asyncio.sleep(0.05)
        stop = asyncio.Event()
        producers = [
            asyncio.create_task(_producer(ours, f"p{k}", acked, unavailable, stop))
            for k in range(PRODUCERS)
        ]
        while sum(1 for r in acked if r.startswith("p")) < 5 * PRODUCERS:
            assert time.monotonic() < deadline, "the producers admitted nothing"
            await asyncio.sleep(0.01)
        in_flight = await _count(
            url, "SELECT count(*) FROM runfleet.runs WHERE status NOT IN "
            "('completed', 'failed', 'cancelled')",
        )  # fmt: skip
        short_after = None
        async with AsyncQueue(
            "default",
            settings=ours.model_copy(
                update={"producer_retry_for": short_budget[1] if short_budget else BUDGET}
            ),
        ) as short_queue:
            killing = asyncio.create_task(asyncio.to_thread(kill, cluster))
            if short_budget is not None:
                await asyncio.sleep(short_budget[0])
                short_after = await _short_budget_call(short_queue)
            killed_at, promoted = await killing
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*producers)
        deadline = time.monotonic() + timeout
        while True:
            left = await _poll(
                url, "SELECT count(*) FROM runfleet.runs WHERE status NOT IN "
                "('completed', 'failed', 'cancelled')",
            )  # fmt: skip
            if (
                left is not None
                and left[0][0] == 0
                and await _count(url, "SELECT count(*) FROM runfleet.runs") > 0
            ):
                break
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- worker {w.pid}:\n{w.log()[-4000:]}" for w in workers)
                raise TimeoutError(f"runs unsettled after {timeout}s ({left}):\n{logs}")
            await asyncio.sleep(0.2)
    finally:
        for w in workers:
            w.close()
    seconds = time.monotonic() - started
    present = {str(r) for (r,) in await _rows(url, "SELECT id FROM runfleet.runs")}
    statuses = Counter(str(s) for (s,) in await _rows(url, "SELECT status FROM runfleet.runs"))
    async with AsyncQueue("default", settings=ours) as queue:
        settled_twice = await queue.store.stats.settled_more_than_once()
    failures = [
        str(e)[:300]
        for (e,) in await _rows(
            url, "SELECT state->'error' FROM runfleet.runs WHERE status = 'failed' LIMIT 5"
        )
    ]
    first_claim, full, rate = await _timings(url, ledger_url, killed_at)
    return Failover(
        admitted=len(acked),
        lost=sorted(set(acked) - present),
        statuses=statuses,
        settled_twice=settled_twice,
        forgotten=await _forgotten(ledger_url),
        unavailable_after=[round(s, 1) for s in unavailable],
        short_budget_after=short_after,
        in_flight_at_kill=in_flight,
        promoted=promoted,
        first_claim_s=first_claim,
        full_throughput_s=full,
        enqueue_per_s=round(enqueue_per_s, 1),
        steps_per_s=round(rate, 1),
        seconds=round(seconds, 1),
        failures=failures,
    )


async def _forgotten(ledger_url: str) -> list[tuple[str, int]]:
    """Steps executed again after their record had been acknowledged to the flow."""
    rows = await _rows(
        ledger_url,
        "SELECT DISTINCT e.run_id, e.step FROM ha_ledger e JOIN ha_ledger a "
        "ON a.run_id = e.run_id AND a.step = e.step AND a.what = 'ack' "
        "WHERE e.what = 'exec' AND e.at > a.at ORDER BY 1, 2",
    )
    return [(str(run), int(str(step))) for run, step in rows]


CLOCK_SLACK_MS = 250
"""A record's ``at_ms`` is the writer's estimate of the server's clock: a claim committed
just before the kill may carry a time a few tens of ms after it. Claims closer than
this to the kill are not counted as new ones (the figure's resolution)."""
CLAIMS = "('claimed-and-activated', 'stolen-and-activated', 'activated', 'resumed')"


async def _timings(
    url: str, ledger_url: str, killed_at: float
) -> tuple[float | None, float | None, float]:
    """(kill to the survivor's first claim, kill to 80 % of the prior step rate, that rate).

    The first claim is the survivor's journal's (a claim record written after the kill);
    the step rate is the ledger's, outside the cluster, in one-second windows from it.
    """
    found = await _rows(
        url,
        f"SELECT min(at_ms) FROM runfleet.journal WHERE kind IN {CLAIMS} AND at_ms >= %s",
        (int(killed_at * 1000) + CLOCK_SLACK_MS,),
    )
    first_ms = found[0][0]
    first = None if first_ms is None else int(str(first_ms)) / 1000 - killed_at
    times = [
        float(str(at))
        for (at,) in await _rows(
            ledger_url, "SELECT extract(epoch FROM at)::float8 FROM ha_ledger WHERE what = 'exec'"
        )
    ]
    window = 3.0
    rate = sum(1 for t in times if killed_at - window <= t < killed_at) / window
    after = [t - killed_at for t in times if t >= killed_at]
    full = None
    resumed = first if first is not None else 0.0
    for start in (resumed + x / 4 for x in range(0, 4 * 90)):
        if rate and sum(1 for t in after if start <= t < start + 1.0) >= 0.8 * rate:
            full = start + 1.0  # the end of the first window back at that rate
            break
    return (
        None if first is None else round(first, 2),
        None if full is None else round(full, 2),
        rate,
    )
