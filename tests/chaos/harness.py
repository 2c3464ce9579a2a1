"""One chaos scenario: 2 worker processes, N five-step flows, a disruption mid-flight.

What must hold afterwards, whatever broke: every run completed with its result (0
failed, 0 lost), one settlement record per run, every step recorded once, and no
recorded step executed again (the ledger has no execution at a later epoch than the
step's record).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import psycopg

import tests.chaos.flows as cf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

RUNS = 300
FLOWS = "tests.chaos.flows"


@dataclass
class Outcome:
    statuses: Counter[str]
    results_ok: bool
    settled_twice: dict[str, int]
    reruns: list[tuple[str, int, int]]
    repeated: int
    releases: int
    recorded_steps: int
    seconds: float
    failures: list[str]


async def _query(url: str, sql: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await (await conn.execute(sql)).fetchall()


async def _poll(url: str, sql: str) -> list[tuple[object, ...]] | None:
    """The rows, or None while the server is down (the disruption may still be on)."""
    try:
        return await _query(url, sql)
    except psycopg.OperationalError:
        return None


async def wait_for_ledger(url: str, rows: int, timeout: float = 30) -> None:
    """Until the fleet has executed ``rows`` steps: the disruption lands mid-flight."""

    async def ran() -> int:
        found = await _poll(url, "SELECT count(*) FROM chaos_ledger")
        return int(found[0][0]) if found else 0  # type: ignore[call-overload]  # rows are tuples of object; the column is an integer

    await until(ran, timeout, f"{rows} steps to run", accept=lambda n: n >= rows, every=0.05)


async def run_scenario(
    settings: Settings,
    ledger_url: str,
    disrupt: Callable[[], Awaitable[None]],
    *,
    runs: int = RUNS,
    flows: Sequence[object] = (cf.five_steps,),
    admin_url: str | None = None,
    concurrency: int = 8,
    timeout: float = 75,
) -> Outcome:
    """Enqueue ``runs`` flows on 2 workers, ``disrupt`` once a third of their steps ran."""
    started = time.monotonic()
    admin = admin_url or settings.database_url
    workers = [
        WorkerProc(settings, flows=FLOWS, concurrency=concurrency, chaos_ledger_url=ledger_url)
        for _ in range(2)
    ]
    try:
        for w in workers:
            await w.wait_started()
        async with AsyncQueue("default", settings=settings) as queue:
            handles = await queue.enqueue_many(
                [EnqueueSpec(flows[i % len(flows)], (i,)) for i in range(runs)]
            )
        await wait_for_ledger(ledger_url, runs * cf.STEPS // 3)
        await disrupt()
        deadline = time.monotonic() + timeout
        next_report = time.monotonic()
        while True:
            rows = await _poll(
                admin,
                "SELECT count(*) FROM runfleet.runs WHERE status NOT IN "
                "('completed', 'failed', 'cancelled')",
            )
            if rows is not None and rows[0][0] == 0:
                break
            if rows is not None and time.monotonic() >= next_report:
                print(f"chaos: {rows[0][0]} runs unsettled at {time.monotonic() - started:.0f}s")
                next_report = time.monotonic() + 5
            if time.monotonic() > deadline:
                stuck = await _poll(
                    admin,
                    "SELECT id, flow, status, waiting_reason, owner_pid, epoch FROM runfleet.runs "
                    "WHERE status NOT IN ('completed', 'failed', 'cancelled') LIMIT 10",
                )
                sessions = await _poll(
                    admin,
                    "SELECT pid, state, wait_event_type, wait_event, "
                    "now() - state_change, left(query, 120) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                logs = "\n".join(f"--- worker {w.pid}:\n{w.log()[-6000:]}" for w in workers)
                raise TimeoutError(
                    f"runs unsettled after {timeout}s: {stuck}\nsessions: {sessions}\n{logs}"
                )
            await asyncio.sleep(0.1)
    finally:
        for w in workers:
            w.close()
    seconds = time.monotonic() - started
    async with AsyncQueue(
        "default", settings=settings.model_copy(update={"database_url": admin})
    ) as queue:
        expected = sum(range(1, cf.STEPS + 1))
        results_ok = [await queue.run(h.id).return_value() for h in handles] == [
            expected + i for i in range(runs)
        ]
        settled_twice = await queue.store.stats.settled_more_than_once()
    return await _outcome(admin, ledger_url, runs, seconds, results_ok, settled_twice)


async def _outcome(
    admin: str,
    ledger_url: str,
    runs: int,
    seconds: float,
    results_ok: bool,
    settled_twice: dict[str, int],
) -> Outcome:
    statuses = Counter(str(s) for (s,) in await _query(admin, "SELECT status FROM runfleet.runs"))
    recorded = await _query(
        admin, "SELECT run_id, key, epoch FROM runfleet.steps WHERE kind = 'step'"
    )
    record_epoch = {
        (str(run), int(str(key).split("#")[0].removeprefix("step:s"))): int(epoch)  # type: ignore[call-overload]  # rows are tuples of object; the columns are integers
        for run, key, epoch in recorded
    }
    ledger = await _query(ledger_url, "SELECT run_id, step, epoch FROM chaos_ledger")
    reruns = [
        (str(run), int(step), int(epoch))  # type: ignore[call-overload]  # rows are tuples of object; the columns are integers
        for run, step, epoch in ledger
        if int(epoch) > record_epoch.get((str(run), int(step)), 1 << 30)  # type: ignore[call-overload]  # rows are tuples of object; the columns are integers
    ]
    executions = Counter((str(run), int(step)) for run, step, _ in ledger)  # type: ignore[call-overload]  # rows are tuples of object; the columns are integers
    releases = await _query(
        admin, "SELECT count(*) FROM runfleet.journal WHERE kind = 'interrupt-released'"
    )
    return Outcome(
        statuses=statuses,
        results_ok=results_ok,
        settled_twice=settled_twice,
        reruns=reruns,
        repeated=sum(n - 1 for n in executions.values()),
        releases=int(releases[0][0]),  # type: ignore[call-overload]  # rows are tuples of object; the column is an integer
        recorded_steps=len(record_epoch),
        failures=[
            str(error)[:300]
            for (error,) in await _query(
                admin, "SELECT state->'error' FROM runfleet.runs WHERE status = 'failed' LIMIT 5"
            )
        ],
        seconds=round(seconds, 1),
    )


def assert_clean(outcome: Outcome, runs: int = RUNS) -> None:
    print(f"chaos outcome: {outcome}")
    assert outcome.statuses == Counter({"completed": runs}), outcome.statuses
    assert outcome.results_ok
    assert outcome.settled_twice == {}
    assert outcome.reruns == []
    assert outcome.recorded_steps == runs * cf.STEPS
