"""Cancellation in every status, with real worker processes (real Postgres + Redis).

Each case checks what the journal says (``cancel-requested`` before ``interrupted``)
and the final status, and none edits rows behind the code's back: a parked run is
made by a real claim and a real park, under an owner identity that no process has.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from functools import partial

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    Activated,
    AlreadyTerminal,
    CancelRequested,
    NewRun,
    Owner,
    Parked,
    RunRow,
    RunStatus,
    Waiting,
    WaitingReason,
)
from tests.fleet.procs import Spawn, WorkerProc, records, running_on
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def settled(store: Store, run_id: str, timeout: float) -> RunRow:
    async def check() -> RunRow | None:
        row = await store.runs.get(run_id)
        return row if row is not None and row.status.terminal else None

    return await until(check, timeout, f"run {run_id} to settle")


async def assert_cancelled(store: Store, run_id: str) -> None:
    row = await store.runs.get(run_id)
    assert row is not None and row.status is RunStatus.CANCELLED, row
    kinds = [r.kind for r in await store.journal.records(run_id)]
    assert kinds.count(Kind.CANCEL_REQUESTED) == 1, kinds
    assert kinds.count(Kind.INTERRUPTED) == 1, kinds
    assert kinds.index(Kind.CANCEL_REQUESTED) < kinds.index(Kind.INTERRUPTED), kinds
    assert Kind.TRANSITIONED not in kinds, kinds


async def test_cancel_pending_on_a_queue_nobody_reads(
    spawn: Spawn, settings: Settings, store: Store
) -> None:
    worker = spawn()  # reads only "default"; its sweeps still run fleet-wide
    await worker.wait_started()
    async with AsyncQueue("nobody", settings=settings) as nobody:
        run = await nobody.enqueue(flows.sleepy, 10)
        assert await run.get_status() is RunStatus.PENDING
        assert isinstance(await run.cancel(), CancelRequested)
    await settled(store, run.id, timeout=5)
    await assert_cancelled(store, run.id)


async def test_cancel_running_is_delivered_by_publish(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    # A slow heartbeat (3 s) so that only the publish can explain a sub-second cancel.
    worker = spawn(heartbeat_interval=3.0, stale_after=15.0)
    await worker.wait_started()
    await until(lambda: _in_log(worker, "notify.subscribed"), 10, "the cancel subscription")
    run = await queue.enqueue(flows.forever)
    await until(lambda: running_on(store, run.id, worker.pid), 10, "run to start")
    started = time.monotonic()
    assert isinstance(await run.cancel(), CancelRequested)
    await settled(store, run.id, timeout=1.0)
    assert time.monotonic() - started < 1.0
    await assert_cancelled(store, run.id)


async def test_cancel_running_without_publish_is_seen_by_the_heartbeat_poll(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    worker = spawn()
    await worker.wait_started()
    run = await queue.enqueue(flows.forever)
    await until(lambda: running_on(store, run.id, worker.pid), 10, "run to start")
    started = time.monotonic()
    # The store call publishes nothing: only the heartbeat's cancel poll can deliver it.
    assert isinstance(await store.lifecycle.request_cancel(run.id), CancelRequested)
    await settled(store, run.id, timeout=2 * settings.heartbeat_interval + 1.0)
    assert time.monotonic() - started < 2 * settings.heartbeat_interval + 1.0
    await assert_cancelled(store, run.id)


async def test_cancel_parked_run_is_woken_and_closed_by_a_sweep(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    run_id = f"parked-{uuid.uuid4().hex[:8]}"
    await store.admission.create(NewRun(id=run_id, flow="tests.forever", payload={"args": []}))
    ghost = Owner("ghost-host", 4_000_000, "0badc0ffee00")  # no such process anywhere
    row = await store.runs.get(run_id)
    assert row is not None
    activated = await store.runs.claim_and_activate(run_id, row.snapshot, ghost)
    assert isinstance(activated, Activated)
    parked = await store.waits.park(
        run_id, ghost, activated.row.epoch, Waiting(reason=WaitingReason.EVENT)
    )
    assert isinstance(parked, Parked)

    worker = spawn()
    await worker.wait_started()
    # Straight to the store: no publish and no wake hint, so only a sweep can close it.
    assert isinstance(await store.lifecycle.request_cancel(run_id), CancelRequested)
    await settled(store, run_id, timeout=5)
    await assert_cancelled(store, run_id)
    (closed,) = await records(store, run_id, Kind.INTERRUPTED)
    assert closed.source_id.split(":")[1] == str(worker.pid)


async def test_cancel_terminal_run_is_refused(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    worker = spawn()
    await worker.wait_started()
    run = await queue.enqueue(flows.sleepy, 10, "done")
    assert (await run.result(timeout=10))["tag"] == "done"
    before = await run.fetch()
    outcome = await run.cancel()
    assert isinstance(outcome, AlreadyTerminal)
    after = await run.fetch()
    assert after.status is RunStatus.COMPLETED
    assert after.cancel_requested_at_ms is None
    assert after.state == before.state
    assert await records(store, run.id, Kind.CANCEL_REQUESTED) == []


async def test_cancel_racing_completion_is_consistent(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    worker = spawn()
    await worker.wait_started()
    rng = random.Random(7)
    seen: dict[str, int] = {"completed": 0, "cancelled": 0}
    for i in range(20):
        run = await queue.enqueue(flows.sleepy, 50, f"race-{i}")
        await until(partial(_started, store, run.id), 10, f"race {i} to start")
        await asyncio.sleep(rng.uniform(0.02, 0.08))  # aim the cancel at the settlement
        outcome = await run.cancel()
        row = await settled(store, run.id, timeout=5)
        kinds = [r.kind for r in await store.journal.records(run.id)]
        match outcome:
            case CancelRequested():
                assert row.status is RunStatus.CANCELLED, (i, kinds)
                await assert_cancelled(store, run.id)
            case AlreadyTerminal():
                assert row.status is RunStatus.COMPLETED, (i, kinds)
                assert row.result["tag"] == f"race-{i}"
                assert row.cancel_requested_at_ms is None
                assert kinds.count(Kind.TRANSITIONED) == 1, kinds
                assert Kind.CANCEL_REQUESTED not in kinds and Kind.INTERRUPTED not in kinds
            case _:
                pytest.fail(f"unexpected cancel outcome {outcome!r}")
        seen[row.status.value] += 1
    assert sum(seen.values()) == 20


async def _started(store: Store, run_id: str) -> bool:
    row = await store.runs.get(run_id)
    return row is not None and row.status is not RunStatus.PENDING


async def _in_log(worker: WorkerProc, event: str) -> bool:
    return event in worker.log()
