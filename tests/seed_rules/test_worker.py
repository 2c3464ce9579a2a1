"""Seed rules observed end to end through an in-process worker and a producer.

Real Postgres and Redis; the worker is the production ``Worker`` in this event loop.
"""

from __future__ import annotations

import pytest

from runfleet.broker import AsyncQueue, RunCancelled
from runfleet.store import Store
from runfleet.store.types import CancelRequested, EventRunSettled, RunStatus
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.seed_rules import flows as sr


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
