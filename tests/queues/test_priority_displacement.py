"""Race: priorities on a queue limited to one slot, across two real worker processes.

Every slot a gated wake offers goes to the queue's best waiting run (docs/how-to/queues.md), so a
lower-priority run's wake is displaced again and again; the displaced run is driven once
more later, and that drive must obey the same rule. Several rounds of mixed priorities
are admitted behind a blocker: the start order must be highest first and no run may
within a priority) and no run may wait for a wake the fleet dropped."""

from __future__ import annotations

import itertools

import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, AsyncRun, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn
from tests.support.polling import until

pytestmark = pytest.mark.chaos

ROUNDS = 4
PRIORITIES = (0, 6, 1, 7, 5, 2, 3, 4, 0, 6)
"""One round's runs, in admission order: every lower one is delivered before a higher one."""
NAP_MS = 60
GAP_S = 3.0
"""The longest a freed slot may stay empty while runs wait (a lost wake waits far longer:
the lost-wake sweep's period)."""


async def test_a_limited_queue_starts_runs_highest_priority_first(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    await store.queues.set("serial", concurrency=1, note="displacement race")
    procs = [spawn(flows="tests.queues.flows", queues="serial", concurrency=4) for _ in range(2)]
    for proc in procs:
        await proc.wait_started()
    async with AsyncQueue("serial", settings=settings) as q:
        for round_no in range(ROUNDS):
            blocker = await q.enqueue(qf.nap, 800)

            async def blocker_running(blocker: AsyncRun = blocker) -> bool:
                return await blocker.get_status() is RunStatus.RUNNING

            await until(blocker_running, 20, "the blocker to hold the only slot")
            runs = await q.enqueue_many(
                [EnqueueSpec(qf.nap, (NAP_MS,), options={"priority": p}) for p in PRIORITIES]
            )
            ids = [r.id for r in runs]

            async def all_done(ids: list[str] = ids) -> bool:
                rows = await store.runs.get_many(ids)
                return all(r.status is RunStatus.COMPLETED for r in rows)

            await until(all_done, 60, f"round {round_no}: every run to complete")
            starts = {
                r.run_id: r.at_ms
                for r in await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
                if r.run_id in ids and isinstance(r.payload, dict) and r.payload.get("epoch") == 1
            }
            order = sorted(ids, key=lambda run_id: starts[run_id])
            got = [PRIORITIES[ids.index(run_id)] for run_id in order]
            assert got == sorted(PRIORITIES, reverse=True), (
                f"round {round_no}: priorities started as {got}"
            )
            at = sorted(starts.values())
            gaps = [(b - a) / 1000 for a, b in itertools.pairwise(at)]
            assert max(gaps) < GAP_S, f"round {round_no}: a start waited {max(gaps):.1f} s"
