"""Deferred completions (first writer wins) and durable clocks (owner-fenced, fire once)."""

from __future__ import annotations

import pytest

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.deferreds import Completion
from runfleet.store.errors import InvalidInput
from runfleet.store.types import (
    ClockAlreadyCompleted,
    ClockCompleted,
    ClockExisting,
    ClockRow,
    ClockScheduled,
    DeferredCompleted,
    DeferredExisting,
    EventCompleted,
    EventTimedOut,
    NotFound,
    NotOwner,
    RunStatus,
    Stolen,
    Waiting,
    WaitingReason,
)
from runfleet.store.values import text_digest
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    counts,
    create,
    db_now,
    journal_kinds,
    make_parked,
    make_running,
    must_get,
    wait_db_time_past,
)

FAR = 10**15

# ---- deferreds ---------------------------------------------------------------


async def test_first_completion_wins(store: Store) -> None:
    await create(store, "r1")
    first = await store.deferreds.complete_deferred("r1", "evt", {"v": 1}, {"by": "alice"})
    assert isinstance(first.outcome, DeferredCompleted) and first.woke is False
    row = first.outcome.row
    assert (row.run_id, row.name, row.value, row.metadata) == (
        "r1",
        "evt",
        {"v": 1},
        {"by": "alice"},
    )
    assert row.completed_at_ms > 0 and row.consumed_at_ms is None

    second = await store.deferreds.complete_deferred("r1", "evt", {"v": 2}, {"by": "bob"})
    assert isinstance(second.outcome, DeferredExisting) and second.woke is False
    assert second.outcome.row == row
    assert await store.deferreds.deferred("r1", "evt") == row
    assert (await journal_kinds(store, "r1")).count("deferred-completed") == 1


async def test_a_losing_completion_is_told_whether_the_winner_has_its_digest(
    store: Store,
) -> None:
    await create(store, "r1")
    first = await store.deferreds.complete_deferred("r1", "evt", {"b": 2, "a": 1.5})
    assert isinstance(first.outcome, DeferredCompleted)
    won = first.outcome.row
    assert won.digest == text_digest('{"a":1.5,"b":2}'), "the digest of the text stored"
    retried = await store.deferreds.complete_deferred("r1", "evt", {"a": 1.5, "b": 2})
    assert retried.outcome == DeferredExisting(won, same=True), "its own value won"
    other = await store.deferreds.complete_deferred("r1", "evt", {"a": 2})
    assert other.outcome == DeferredExisting(won, same=False), "another value won"
    (record,) = [r for r in await store.journal.records("r1") if r.kind == "deferred-completed"]
    assert record.payload["digest"] == won.digest, "the journal says which value won"


async def test_a_waits_timeout_is_a_completion_no_later_answer_overwrites(
    store: Store,
) -> None:
    await create(store, "r1")
    timed = await store.deferreds.time_out("r1", "evt")
    assert isinstance(timed.outcome, DeferredCompleted) and timed.outcome.row.timed_out
    late = await store.deferreds.answer_event("r1", "evt", None)
    assert late == EventTimedOut("r1", "evt"), "never taken for an answer, even a null one"
    again = await store.deferreds.complete_deferred("r1", "evt", None)
    assert again.outcome == DeferredExisting(timed.outcome.row, same=False)
    assert await store.deferreds.time_out("r1", "evt") == Completion(
        DeferredExisting(timed.outcome.row, same=False), woke=False
    )

    await create(store, "r2")
    answered = await store.deferreds.answer_event("r2", "evt", "in time")
    assert isinstance(answered, EventCompleted)
    lost = await store.deferreds.time_out("r2", "evt")
    assert isinstance(lost.outcome, DeferredExisting) and not lost.outcome.row.timed_out
    assert lost.outcome.row.value == "in time", "an answer that came first stands"


async def test_completion_with_no_value(store: Store) -> None:
    await create(store, "r1")
    done = await store.deferreds.complete_deferred("r1", "evt")
    assert isinstance(done.outcome, DeferredCompleted)
    got = await store.deferreds.deferred("r1", "evt")
    assert got is not None and got.value is None and got.metadata is None


async def test_completion_for_an_unknown_run_is_refused(store: Store, database_url: str) -> None:
    before = await counts(database_url)
    with pytest.raises(InvalidInput) as caught:
        await store.deferreds.complete_deferred("ghost", "evt", 1)
    assert caught.value.field == "run_id"
    assert await counts(database_url) == before


async def test_deferred_get_of_unknown_is_none(store: Store) -> None:
    await create(store, "r1")
    assert await store.deferreds.deferred("r1", "nothing") is None
    assert await store.deferreds.deferred("ghost", "evt") is None


async def test_consume_marks_once(store: Store) -> None:
    await create(store, "r1")
    await store.deferreds.complete_deferred("r1", "evt", 1)
    assert await store.deferreds.consume_deferred("r1", "evt") is True
    assert await store.deferreds.consume_deferred("r1", "evt") is False
    assert await store.deferreds.consume_deferred("r1", "never-completed") is False
    consumed = await store.deferreds.deferred("r1", "evt")
    assert consumed is not None and consumed.consumed_at_ms is not None
    assert consumed.value == 1, "the row stays as replay evidence"


async def test_completed_deferreds_lists_a_runs_completions_in_order(store: Store) -> None:
    await create(store, "r1")
    await create(store, "r2")
    first = await store.deferreds.complete_deferred("r1", "b-first", 1)
    assert isinstance(first.outcome, DeferredCompleted)
    await wait_db_time_past(store, first.outcome.row.completed_at_ms)
    await store.deferreds.complete_deferred("r1", "a-second", 2)
    await store.deferreds.complete_deferred("r2", "other", 3)
    await store.deferreds.consume_deferred("r1", "b-first")
    listed = await store.deferreds.completed_deferreds("r1")
    assert [(d.name, d.value) for d in listed] == [("b-first", 1), ("a-second", 2)]
    assert listed[0].consumed_at_ms is not None
    assert await store.deferreds.completed_deferreds("ghost") == []


# ---- clocks ------------------------------------------------------------------


async def test_schedule_clock_is_owner_fenced_and_existing_wins(store: Store) -> None:
    await make_running(store, "r1")
    scheduled = await store.waits.schedule_clock("r1", "nap", "nap:done", 5_000, OWNER_A, 1)
    assert scheduled == ClockScheduled(ClockRow("r1", "nap", "nap:done", 5_000, None))
    replayed = await store.waits.schedule_clock("r1", "nap", "nap:done", 9_999, OWNER_A, 1)
    assert replayed == ClockExisting(ClockRow("r1", "nap", "nap:done", 5_000, None))

    assert isinstance(await store.waits.schedule_clock("r1", "other", "d", 1, OWNER_B, 1), NotOwner)
    assert isinstance(await store.waits.schedule_clock("r1", "other", "d", 1, OWNER_A, 2), NotOwner)
    assert await store.waits.schedule_clock("ghost", "nap", "d", 1, OWNER_A, 1) == NotFound("ghost")
    assert await store.waits.clock("r1", "other") is None
    assert [c.name for c in await store.waits.pending_clocks("r1")] == ["nap"]


async def test_schedule_clock_after_losing_the_run_is_refused(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    stolen = await store.runs.steal(
        "r1", running.snapshot, OWNER_B, jr.ProbeEvidence(), stale_after_ms=0
    )
    assert isinstance(stolen, Stolen)
    refused = await store.waits.schedule_clock("r1", "nap", "d", 1, OWNER_A, 1)
    assert isinstance(refused, NotOwner) and refused.current.owner == OWNER_B
    assert await store.waits.pending_clocks("r1") == []


async def test_complete_clock_fires_once_and_completes_its_deferred(store: Store) -> None:
    await make_running(store, "r1")
    await store.waits.schedule_clock("r1", "nap", "nap:done", 1, OWNER_A, 1)
    fired = await store.waits.complete_clock("r1", "nap")
    assert isinstance(fired.outcome, ClockCompleted) and fired.woke is False
    fired_at = fired.outcome.row.completed_at_ms
    assert fired_at is not None
    deferred = await store.deferreds.deferred("r1", "nap:done")
    assert deferred is not None
    assert deferred.value == {"fired_at_ms": fired_at}

    again = await store.waits.complete_clock("r1", "nap")
    assert isinstance(again.outcome, ClockAlreadyCompleted) and again.woke is False
    assert again.outcome.row.completed_at_ms == fired_at
    kinds = await journal_kinds(store, "r1")
    assert kinds.count("clock-fired") == 1 and kinds.count("deferred-completed") == 1
    missing = await store.waits.complete_clock("r1", "never")
    assert missing.outcome == NotFound("r1")


async def test_firing_a_clock_wakes_the_run_parked_on_it(store: Store) -> None:
    await make_running(store, "r1")
    await store.waits.schedule_clock("r1", "nap", "nap:done", 1, OWNER_A, 1)
    await store.waits.park(
        "r1", OWNER_A, 1, Waiting(WaitingReason.TIMER, wake_at_ms=1), deferred="nap:done"
    )
    fired = await store.waits.complete_clock("r1", "nap")
    assert isinstance(fired.outcome, ClockCompleted) and fired.woke is True
    row = await must_get(store, "r1")
    assert row.status is RunStatus.SUSPENDED and row.waiting is None
    assert (await journal_kinds(store, "r1"))[-2:] == ["deferred-completed", "clock-fired"]


async def test_firing_a_clock_whose_deferred_was_already_completed(store: Store) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.TIMER), deferred="other")
    await make_running(store, "r2")
    await store.waits.schedule_clock("r2", "nap", "nap:done", 1, OWNER_A, 1)
    await store.deferreds.complete_deferred("r2", "nap:done", "early")
    fired = await store.waits.complete_clock("r2", "nap")
    assert isinstance(fired.outcome, ClockCompleted) and fired.woke is False
    got = await store.deferreds.deferred("r2", "nap:done")
    assert got is not None and got.value == "early"


async def test_due_clocks_lists_only_due_unfired_clocks_earliest_first(store: Store) -> None:
    await make_running(store, "r1")
    await make_running(store, "r2")
    now = await db_now(store)
    await store.waits.schedule_clock("r1", "late", "d1", FAR, OWNER_A, 1)
    await store.waits.schedule_clock("r1", "b", "d2", now - 10, OWNER_A, 1)
    await store.waits.schedule_clock("r2", "a", "d3", now - 20, OWNER_A, 1)
    await store.waits.schedule_clock("r2", "fired", "d4", now - 30, OWNER_A, 1)
    await store.waits.complete_clock("r2", "fired")
    due = await store.waits.due_clocks()
    assert [(c.run_id, c.name) for c in due] == [("r2", "a"), ("r1", "b")]
    assert [(c.run_id, c.name) for c in await store.waits.due_clocks(limit=1)] == [("r2", "a")]


async def test_pending_clocks_and_complete_run_clocks(store: Store) -> None:
    await make_running(store, "r1")
    await make_running(store, "r2")
    await store.waits.schedule_clock("r1", "z", "dz", 20, OWNER_A, 1)
    await store.waits.schedule_clock("r1", "y", "dy", 10, OWNER_A, 1)
    await store.waits.schedule_clock("r1", "x", "dx", 30, OWNER_A, 1)
    await store.waits.schedule_clock("r2", "w", "dw", 5, OWNER_A, 1)
    await store.waits.complete_clock("r1", "x")
    assert [c.name for c in await store.waits.pending_clocks("r1")] == ["y", "z"]
    assert await store.waits.complete_run_clocks("r1") == 2
    assert await store.waits.complete_run_clocks("r1") == 0
    assert await store.waits.pending_clocks("r1") == []
    assert [c.name for c in await store.waits.pending_clocks("r2")] == ["w"]
    assert await store.deferreds.deferred("r1", "dy") is None, "closing clocks completes nothing"
