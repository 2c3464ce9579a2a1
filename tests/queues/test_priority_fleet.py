"""Priorities across a real worker process: with a backlog, a high-priority run admitted
last starts next, and every run whose delivery it took still runs (its wake re-published)."""

from __future__ import annotations

import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn
from tests.support.polling import until

pytestmark = pytest.mark.chaos

BACKLOG = 30


async def test_a_high_priority_run_admitted_last_starts_next(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    proc = spawn(flows="tests.queues.flows", concurrency=1)
    await proc.wait_started()
    blocker = await queue.enqueue(qf.nap, 1500)

    async def blocker_running() -> bool:
        return await blocker.get_status() is RunStatus.RUNNING

    await until(blocker_running, 20, "the blocker to hold the only slot")
    backlog = await queue.enqueue_many([EnqueueSpec(qf.nap, (10,)) for _ in range(BACKLOG)])
    urgent = await queue.enqueue(qf.nap, 10, priority=5)
    flowed = await queue.enqueue(qf.urgent)  # its @flow(priority=7): before both
    assert (await store.runs.get(flowed.id)).priority == 7  # type: ignore[union-attr]  # the run exists: it was just enqueued

    ids = [r.id for r in backlog] + [urgent.id, flowed.id]

    async def all_done() -> bool:
        rows = await store.runs.get_many(ids)
        return all(r.status is RunStatus.COMPLETED for r in rows)

    await until(all_done, 60, "every run to complete (none may lose its wake)")
    starts = [
        r.run_id
        for r in await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
        if isinstance(r.payload, dict) and r.payload.get("epoch") == 1
    ]
    assert starts[0] == blocker.id
    assert starts[1:3] == [flowed.id, urgent.id], starts[:5]
    # FIFO within the backlog's priority: the low runs start in admission order.
    assert starts[3:] == [r.id for r in backlog]
