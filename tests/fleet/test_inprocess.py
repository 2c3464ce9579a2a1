"""The driver end to end inside the test's own event loop (real Postgres + Redis)."""

from __future__ import annotations

import asyncio

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue, RunCancelled, RunFailed
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.support.polling import until


async def test_round_trip_plain_function(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(flows.add, 2, 3)
    assert await run.result(timeout=10) == 5
    assert await run.get_status() is RunStatus.COMPLETED


async def test_flow_failure_and_unencodable_result(worker: Worker, queue: AsyncQueue) -> None:
    failing = await queue.enqueue(flows.boom, "kaput")
    with pytest.raises(RunFailed) as info:
        await failing.result(timeout=10)
    assert info.value.exc_type == "ValueError"
    odd = await queue.enqueue(flows.unencodable)
    with pytest.raises(RunFailed) as info:
        await odd.result(timeout=10)
    assert info.value.exc_type == "UnstorableValue"


async def test_cancel_running(worker: Worker, queue: AsyncQueue, store: Store) -> None:
    run = await queue.enqueue(flows.forever)
    await until(run.get_status, 10, "the run to start", accept=lambda s: s is RunStatus.RUNNING)
    await run.cancel()
    with pytest.raises(RunCancelled):
        await run.result(timeout=5)
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert kinds[-2:] == ["cancel-requested", "interrupted"]


async def test_concurrency_limit(worker: Worker, queue: AsyncQueue, store: Store) -> None:
    runs = [await queue.enqueue(flows.sleepy, 300) for _ in range(20)]
    peak = 0

    async def in_flight() -> int:
        nonlocal peak
        peak = max(peak, len(worker.driver.owned) if worker.driver else 0)
        return peak

    # Sampled until every run settled: the limit must be reached, and never passed.
    results = asyncio.ensure_future(asyncio.gather(*(r.result(timeout=10) for r in runs)))
    await until(
        in_flight, 10, "the worker to fill its slots", accept=lambda p: p >= worker.concurrency
    )
    while not results.done():
        await in_flight()
        await asyncio.sleep(0.02)
    assert all(await results)
    assert peak == worker.concurrency


async def test_interrupt_unsafe_is_refused(queue: AsyncQueue, store: Store) -> None:
    from runfleet.store.errors import CancelRequestFailed

    run = await queue.enqueue(flows.add, 1, 2)
    with pytest.raises(CancelRequestFailed) as info:
        await queue.interrupt_unsafe(run.id)
    assert info.value.code == "unsafe_interrupt_unsupported"
    row = await store.runs.get(run.id)
    assert row is not None and row.cancel_requested_at_ms is None


async def test_a_run_this_process_owns_but_no_longer_drives_is_taken_back(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """E.g. its settlement gave up during a long outage: nobody would ever renew it."""
    from runfleet.store.types import Activated, NewRun

    created = await store.admission.create(
        NewRun(id="orphan", flow="tests.fleet.flows:add", payload={"args": [2, 3]})
    )
    outcome = await store.runs.claim_and_activate("orphan", created.row.snapshot, worker.owner)
    assert isinstance(outcome, Activated)
    assert await queue.run("orphan").result(timeout=10) == 5
    (steal,) = [
        r for r in await store.journal.records("orphan") if r.kind == "stolen-and-activated"
    ]
    assert steal.payload["probe"] == "self-orphaned"
    assert steal.payload["previous_owner"] == worker.owner.key
