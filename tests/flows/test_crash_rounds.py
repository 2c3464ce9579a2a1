"""Timers and handoffs across SIGKILLs, with real worker processes."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal

import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue, RunFailed
from runfleet.store import Store
from runfleet.store.types import NewRun, Owner, RunStatus
from tests.fleet.procs import Spawn, records, running_on
from tests.support.polling import until

pytestmark = pytest.mark.chaos
FLOWS = "tests.flows.flows"


async def test_a_timer_due_while_its_owner_is_dead_resumes_after_the_steal(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    # Slept in-process (its clock durable), and long enough that B starts and A is killed
    # before the clock is due, on a loaded box too.
    a = spawn(flows=FLOWS, inline_sleep_max=10)
    await a.wait_started()
    run = await queue.enqueue(f.sleeper, 6)
    await until(lambda: running_on(store, run.id, a.pid), 10, "the sleep to start on A")
    await until(lambda: store.waits.pending_clocks(run.id), 10, "the clock to be scheduled")
    b = spawn(flows=FLOWS, inline_sleep_max=10)
    await b.wait_started()
    unfired = await store.waits.clock(run.id, "sleep:sleep#1")
    assert unfired is not None and unfired.completed_at_ms is None, "the clock fired on A"
    a.signal(signal.SIGKILL)
    assert await run.result(timeout=30) == "woke"
    (steal,) = await records(store, run.id, "stolen-and-activated")
    fired = await store.waits.clock(run.id, "sleep:sleep#1")
    assert fired is not None and fired.completed_at_ms is not None
    assert fired.completed_at_ms >= fired.due_at_ms
    thief = Owner.parse(str(steal.payload["owner"]))
    assert thief is not None and thief.pid == b.pid


async def test_handoffs_under_random_sigkills_leave_a_whole_lineage(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    workers = [spawn(flows=FLOWS) for _ in range(2)]
    for w in workers:
        await w.wait_started()
    rounds = 40
    run = await queue.enqueue(f.many_rounds, rounds)
    rng = random.Random(3)
    for _ in range(4):
        await asyncio.sleep(rng.uniform(0.3, 0.8))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.signal(signal.SIGKILL)
        workers.append(spawn(flows=FLOWS))
    assert await run.result(timeout=90) == "done"
    ids = [run.id] + [f"{run.id}@{n}" for n in range(1, rounds + 1)]
    rows = await store.runs.get_many(ids)
    by_id = {r.id: r for r in rows}
    assert set(by_id) == set(ids), "a round is missing: settle and successor came apart"
    for this, successor in itertools.pairwise(ids):
        assert by_id[this].status is RunStatus.COMPLETED
        assert by_id[this].state["handed_off_to"] == successor
        assert by_id[successor].parent_run_id == this
    assert await store.stats.settled_more_than_once() == {}


async def test_a_handoff_whose_successor_id_is_taken_fails_the_round(
    worker: object, queue: AsyncQueue, store: Store
) -> None:
    await store.admission.create(NewRun(id="lin@1", flow="t.leaf", lineage_id="elsewhere"))
    run = await queue.enqueue(f.rounds, 2, run_id="lin")
    with pytest.raises(RunFailed) as info:
        await run.result(timeout=10)
    assert info.value.exc_type == "ExecutionIdentityConflict"
    assert [r.kind for r in await store.journal.records(run.id)][-1] == "round-invalid"
    squat = await store.runs.get("lin@1")
    assert squat is not None and squat.flow == "t.leaf" and squat.lineage_id == "elsewhere"
