"""100 five-step runs while workers are SIGKILLed at random: nothing lost, nothing redone.

Each step appends to a ledger table through its own connection (a side effect
runfleet does not control). A recorded step must never run again; a step in
flight at a crash may run once more per crash (at-least-once), no more.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter

import psycopg
import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.procs import WorkerProc

pytestmark = pytest.mark.chaos
RUNS, KILLS, FLEET = 100, 30, 3


async def test_five_step_flows_survive_random_sigkills(settings: Settings, store: Store) -> None:
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "CREATE TABLE ledger (run_id text, step int, epoch int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
    workers = [WorkerProc(settings, flows="tests.flows.flows", concurrency=3) for _ in range(FLEET)]
    kills = 0
    try:
        for w in workers:
            await w.wait_started()
        async with AsyncQueue("default", settings=settings) as queue:
            runs = await queue.enqueue_many([EnqueueSpec(f.ledger, (i, 0.1)) for i in range(RUNS)])
            rng = random.Random(7)
            while kills < KILLS:
                await asyncio.sleep(rng.uniform(0.2, 0.5))
                victim = workers.pop(rng.randrange(len(workers)))
                victim.signal(signal.SIGKILL)
                await victim.wait_exit()
                victim.close()
                kills += 1
                workers.append(WorkerProc(settings, flows="tests.flows.flows", concurrency=3))
            try:
                results = [await r.result(timeout=60) for r in runs]
            except TimeoutError:
                pytest.fail(f"runs left unsettled: {await _unsettled(settings)}")
        assert results == [15 + i for i in range(RUNS)]
    finally:
        for w in workers:
            w.close()

    async with await psycopg.AsyncConnection.connect(settings.database_url) as c:
        ledger = await (await c.execute("SELECT run_id, step, epoch FROM ledger")).fetchall()
        recorded = await (
            await c.execute("SELECT run_id, key, epoch FROM runfleet.steps WHERE kind = 'step'")
        ).fetchall()
    assert len(recorded) == RUNS * 5
    record_epoch = {
        (run, int(key.split("#")[0].removeprefix("step:s"))): epoch for run, key, epoch in recorded
    }
    # A recorded step never runs again: no execution at a later epoch than its record.
    rerun = [(run, step, epoch) for run, step, epoch in ledger if epoch > record_epoch[(run, step)]]
    assert rerun == []
    executions = Counter((run, step) for run, step, _ in ledger)
    assert set(executions) == set(record_epoch)
    extra = sum(n - 1 for n in executions.values())
    assert extra <= kills, f"{extra} repeated executions for {kills} kills"
    assert await store.stats.settled_more_than_once() == {}
    steals = await store.stats.records_of_kind("stolen-and-activated")
    assert steals, "the kills never forced a takeover"


async def _unsettled(settings: Settings) -> list[tuple[object, ...]]:
    """Each run not yet settled, with why it waits (the failure message of a lost run)."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as c:
        cursor = await c.execute(
            "SELECT id, status, waiting_reason, recoveries, epoch, waiting_request "
            "FROM runfleet.runs WHERE status NOT IN ('completed', 'failed', 'cancelled')"
        )
        return list(await cursor.fetchall())
