"""Seed rules observed end to end through an in-process worker and a producer.

Real Postgres and Redis; the worker is the production ``Worker`` in this event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from runfleet.broker.client import connect
from runfleet.broker.liveness import FleetMember, Liveness
from runfleet.producer import AsyncQueue, RunCancelled
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import CancelRequested, EventRunSettled, JournalRecord, RunStatus
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.seed_rules import flows as sr
from tests.support.polling import until


async def test_cascaded_children_close_through_their_own_cancel_path(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """A parked attached child with compensating steps: cancelling its parent runs the
    child's compensations, newest first, before the child is closed ``cancelled``."""
    sr.UNDONE.clear()
    run = await queue.enqueue(sr.parent_of_compensating, "cc")
    await parked(store, run.id, "child")
    (edge,) = await store.dag.children(run.id)
    await parked(store, edge.child_id, "event")
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=15)
    with pytest.raises(RunCancelled):
        await queue.run(edge.child_id).result(timeout=15)
    assert sr.UNDONE == ["cc-2", "cc-1"], "the child's compensations ran, newest first"
    child = await store.runs.get(edge.child_id)
    assert child is not None and child.status is RunStatus.CANCELLED


async def test_run_cancel_follows_the_lineage_like_result(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(sr.lineage, 2)  # rounds 0 and 1 hand off; round 2 parks
    await parked(store, f"{run.id}@2", "event")
    outcome = await run.cancel()
    assert isinstance(outcome, CancelRequested) and outcome.row.id == f"{run.id}@2"
    with pytest.raises(RunCancelled):
        await run.result(timeout=15)
    last = await store.runs.get(f"{run.id}@2")
    assert last is not None and last.status is RunStatus.CANCELLED


async def test_a_settled_run_answers_false_to_a_late_completion(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(sr.waiter)
    await parked(store, run.id, "event")
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=15)
    before = [r.kind for r in await store.journal.records(run.id)]
    assert isinstance(await queue.complete(run.id, "go", {"late": True}), EventRunSettled)
    assert await store.deferreds.deferred(run.id, "go") is None
    assert [r.kind for r in await store.journal.records(run.id)] == before


async def test_a_worker_journals_how_long_its_lease_went_unconfirmed_when_it_lapses(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    """The worker's own wiring of the lapse gap: its renewals stall in Postgres (the runs
    table locked: a row lock does not stall the renewal, which skips locked rows), its
    lease lapses, and the release its drive writes once the database answers records how
    long the lease had gone unconfirmed."""
    sr.STARTED.clear()
    sr.STOPPED.clear()
    run = await queue.enqueue(sr.holds)
    await until(lambda: _true_if(run.id in sr.STARTED), 10, "the body to start on the worker")
    async with _runs_table_locked(settings.database_url):
        await until(lambda: _true_if(run.id in sr.STOPPED), 10, "the lapse to stop the body")
    released = await until(
        lambda: _records(store, run.id, Kind.INTERRUPT_RELEASED),
        10,
        "the lapse release to be written",
        accept=bool,
    )
    assert released[0].payload["cause"] == "lease-lapsed", released[0].payload
    assert released[0].payload["unconfirmed_ms"] >= settings.lapse_after * 1000, released[0]


@contextlib.asynccontextmanager
async def _runs_table_locked(database_url: str) -> AsyncIterator[None]:
    """Hold ``runfleet.runs`` ACCESS EXCLUSIVE: every statement on it queues behind."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("LOCK TABLE runfleet.runs IN ACCESS EXCLUSIVE MODE")
            yield


async def _true_if(value: bool) -> bool:
    return value


async def _records(store: Store, run_id: str, kind: str) -> list[JournalRecord]:
    return [r for r in await store.journal.records(run_id) if r.kind == kind]


async def test_a_started_worker_describes_itself_in_its_liveness_key(settings: Settings) -> None:
    """The key the worker's lease writes (``Worker._refresh``): its owner, not lapsed, a
    confirmed renewal, when it started, the queues it serves (two here) and the runs it
    holds (none), for at most the liveness TTL."""
    worker = Worker(settings, queues=["default", "second"], concurrency=2)
    task = asyncio.create_task(worker.run())
    redis = connect(settings)
    try:
        await asyncio.wait_for(worker.started.wait(), 10)
        liveness = Liveness.for_settings(redis, settings)

        async def mine() -> FleetMember | None:
            found = [m for m in await liveness.fleet() if m.owner == worker.owner]
            return found[0] if found else None

        member = await until(mine, 10, "the worker's liveness key")
    finally:
        await redis.aclose()
        worker.stop(hard=True)
        await asyncio.wait_for(task, 15)
    assert member.lapsed is False and member.confirmed_ms > 0, member
    assert (member.queues, member.runs) == (("default", "second"), 0), member
    assert member.started_ms is not None
    assert abs(member.started_ms - time.time() * 1000) < 60_000, member
    assert 0 < member.ttl_ms <= settings.liveness_ttl * 1000, member
