"""Durable waits: timers, events with timeouts, approvals, quotas, deadlines, sync bodies."""

from __future__ import annotations

import time
import uuid

import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue, EventCompleted, EventTimedOut, RunCancelled
from runfleet.store import Store
from runfleet.store.errors import InvalidInput
from runfleet.store.waits import token_hash
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.support.polling import until


async def test_long_sleep_parks_on_a_durable_clock(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    started = time.monotonic()
    run = await queue.enqueue(f.sleeper, 2.5)
    row = await parked(store, run.id, "timer")
    assert row.waiting is not None and row.waiting.wake_at_ms is not None
    (clock,) = await store.waits.pending_clocks(run.id)
    assert clock.due_at_ms == row.waiting.wake_at_ms
    assert await run.result(timeout=10) == "woke"
    elapsed = time.monotonic() - started
    assert 2.5 <= elapsed < 2.5 + 1.5
    assert await store.waits.pending_clocks(run.id) == []


async def test_short_sleep_holds_its_slot_but_stays_durable(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.sleeper, 0.3)
    assert await run.result(timeout=5) == "woke"
    clock = await store.waits.clock(run.id, "sleep:sleep#1")
    assert clock is not None and clock.completed_at_ms is not None


async def test_event_timeout_raises_in_the_body(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(f.event_timeout)
    assert await run.result(timeout=10) == "timed out"


async def _parked_on(store: Store, run_id: str, event: str) -> None:
    async def check() -> bool:
        row = await store.runs.get(run_id)
        return bool(row and row.waiting and row.waiting.token == event)

    await until(check, 10, f"run {run_id} to park on the event {event!r}")


async def test_wait_for_timeout_zero_takes_an_answer_already_there(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.zero_wait)
    await _parked_on(store, run.id, "start")
    assert isinstance(await queue.complete(run.id, "now", "early"), EventCompleted)
    await queue.complete(run.id, "start")
    assert await run.result(timeout=10) == "early"


async def test_wait_for_timeout_zero_unanswered_times_out_at_once_and_for_good(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.zero_wait)
    await _parked_on(store, run.id, "start")
    await queue.complete(run.id, "start")
    await _parked_on(store, run.id, "after")  # it timed out without parking on "now"
    late = await queue.complete(run.id, "now", "too late")
    assert late == EventTimedOut(run.id, "now") and not late, "the timeout is recorded"
    await queue.complete(run.id, "after")  # resumes by replay: "now" is decided again
    assert await run.result(timeout=10) == "timed out", "a replay times out again"
    timed = await store.deferreds.deferred(run.id, "now")
    assert timed is not None and timed.timed_out and timed.value is None
    (record,) = [
        r
        for r in await store.journal.records(run.id)
        if r.kind == "deferred-completed" and r.payload["name"] == "now"
    ]
    assert record.payload["timed_out"] is True


async def test_approval_with_token_actor_and_journal(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.approver, 40)
    row = await parked(store, run.id, "approval")
    assert row.waiting is not None and row.waiting.request == {"amount": 40}
    token = f.TOKENS[run.id]  # delivered by on_token; the row keeps only its hash
    assert row.waiting.token == token_hash(token) and token not in str(row.waiting)
    with pytest.raises(InvalidInput):
        await queue.approve(run.id, "wrong-token", actor="mallory")
    with pytest.raises(InvalidInput):  # the stored hash is not a token
        await queue.approve(run.id, row.waiting.token, actor="mallory")
    await queue.approve(run.id, token, {"limit": 50}, actor="alice", reason="within budget")
    assert await run.result(timeout=10) == {
        "approved": True,
        "actor": "postgres",  # the authenticated database role
        "value": {"limit": 50},
    }
    (decision,) = [r for r in await store.journal.records(run.id) if r.kind == "approval-approved"]
    assert decision.payload["actor"] == "postgres" and decision.payload["note"] == "alice"
    assert decision.payload["reason"] == "within budget"
    everything = str([r.payload for r in await store.journal.records(run.id)])
    everything += str([s.output for s in await store.steps.of_run(run.id)])
    assert token not in everything


async def test_denial_is_a_falsy_decision(worker: Worker, queue: AsyncQueue, store: Store) -> None:
    run = await queue.enqueue(f.approver, 99)
    row = await parked(store, run.id, "approval")
    assert row.waiting is not None and row.waiting.token is not None
    await queue.deny(run.id, f.TOKENS[run.id], actor="bob", reason="too much")
    assert (await run.result(timeout=10))["approved"] is False


async def test_quota_parks_until_its_window(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    wake_at = await store.stats.now_ms() + 1500
    run = await queue.enqueue(f.quota, wake_at)
    await parked(store, run.id, "quota")
    assert await run.result(timeout=10) == "after quota"
    assert await store.stats.now_ms() >= wake_at


async def test_deadline_cancels_through_the_ordinary_path(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.slow)
    row = await store.runs.get(run.id)
    assert row is not None and row.state["deadline_ms"] - row.created_at_ms == 500
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    requests = [r for r in await store.journal.records(run.id) if r.kind == "cancel-requested"]
    assert requests[0].payload["note"] == "deadline"  # what it is; the actor is the role
    assert requests[0].payload["actor"] == "postgres"


async def test_a_sub_second_job_timeout_is_a_deadline_in_milliseconds(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """``job_timeout=0.3`` is 300 ms from admission (it was cut to 0 s: cancelled at once)."""
    for given, expected_ms in ((1.5, 1500), (0.0004, 1), ("2s", 2000)):
        admitted = await queue.enqueue(f.event_timeout, job_timeout=given)
        row = await store.runs.get(admitted.id)
        assert row is not None and row.deadline_ms == row.created_at_ms + expected_ms, given
    run = await queue.enqueue(f.slow, job_timeout=0.3)  # over the flow's own 0.5 s
    row = await store.runs.get(run.id)
    assert row is not None and row.deadline_ms == row.created_at_ms + 300
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    records = await store.journal.records(run.id)
    kinds = [r.kind for r in records]
    assert kinds.index("claimed-and-activated") < kinds.index("cancel-requested")
    (asked,) = [r for r in records if r.kind == "cancel-requested"]
    assert asked.payload["note"] == "deadline"
    assert asked.at_ms >= row.created_at_ms + 300, "cancelled at its deadline, not before"


async def test_sync_flow_has_the_same_api(worker: Worker, queue: AsyncQueue, store: Store) -> None:
    tag = uuid.uuid4().hex[:6]
    run = await queue.enqueue(f.sync_flow, tag)
    await parked(store, run.id, "event")
    await queue.complete(run.id, "go", "value")
    assert await run.result(timeout=10) == [1, "value"]
    assert f.CALLS[f"{tag}:sync"] == 1


async def test_clocks_of_a_settled_run_never_fire(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.sleeper, 60)
    await parked(store, run.id, "timer")
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    assert await store.waits.pending_clocks(run.id) == []
    assert [c.run_id for c in await store.waits.due_clocks()] == []
