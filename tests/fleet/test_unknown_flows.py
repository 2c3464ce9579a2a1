"""Runs of a flow no worker knows: left pending (never failed), warned once, cancellable.

A worker that cannot resolve a run's flow must not fail it (another worker, or the
next deploy, may know it) and must not hold it; the lost-pending sweep keeps
re-dispatching it, and the driver warns once per run rather than once per wake.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.codec import FIELD, decode
from runfleet.broker.keys import GROUP
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import CancelRequested, RunStatus
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

UNKNOWN = "nosuch.module:fn"


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[WorkerProc]:
    proc = WorkerProc(settings)  # imports tests.fleet.flows only
    try:
        await proc.wait_started()
        yield proc
    finally:
        proc.close()


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[AsyncQueue]:
    async with AsyncQueue("default", settings=settings, late_binding=True) as q:
        yield q


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def sweep_wakes(redis: Redis, stream: str, run_id: str) -> int:
    """How many lost-pending wakes for ``run_id`` the sweeps have put on the stream."""
    found = 0
    for _, fields in await redis.xrange(stream) or []:
        packed = fields.get(FIELD) if fields else None
        assert isinstance(packed, bytes), fields
        message = decode(packed)
        found += message.run == run_id and message.reason == "sweep:lost_pending"
    return found


async def group_drained(redis: Redis, stream: str) -> bool:
    """Every entry on the stream was delivered to a worker and acknowledged."""
    for group in await redis.xinfo_groups(stream):
        if group["name"] in (GROUP, GROUP.encode()):
            return int(group["lag"] or 0) == 0 and int(group["pending"]) == 0
    return False


async def test_unknown_flow_stays_pending_and_is_warned_once(
    worker: WorkerProc, queue: AsyncQueue, store: Store, settings: Settings, redis: Redis
) -> None:
    run = await queue.enqueue(UNKNOWN, 1, 2)
    stream = f"{settings.redis_prefix}:q:default"

    async def five_wakes() -> bool:
        return await sweep_wakes(redis, stream, run.id) >= 5

    # Five sweep cycles re-dispatched it, and the worker read and acknowledged them all.
    # Each wake counts as lost once the queue's wake mark passed the previous one.
    await until(five_wakes, 5 * settings.lost_wake_within_ms / 1000 + 5, "five sweep wakes")
    await until(lambda: group_drained(redis, stream), 5, "the worker to consume every wake")

    row = await run.fetch()
    assert row.status is RunStatus.PENDING
    assert row.owner is None and row.claim is None
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert kinds == [Kind.CREATED], kinds
    warnings = [
        line for line in worker.log().splitlines() if "run.unknown_flow" in line and run.id in line
    ]
    assert len(warnings) == 1, warnings
    assert worker.proc.poll() is None


async def test_cancel_of_unknown_flow_run_is_closed_without_a_handler(
    worker: WorkerProc, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(UNKNOWN, 3)
    assert isinstance(await run.cancel(), CancelRequested)

    async def cancelled() -> bool:
        return await run.get_status() is RunStatus.CANCELLED

    await until(cancelled, 5, "the unknown-flow run to be cancelled")
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert kinds.count(Kind.CANCEL_REQUESTED) == 1 and kinds.count(Kind.INTERRUPTED) == 1
    assert kinds.index(Kind.CANCEL_REQUESTED) < kinds.index(Kind.INTERRUPTED), kinds
    assert Kind.TRANSITIONED not in kinds
