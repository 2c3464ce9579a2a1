"""Parks and wakes, the waiting queries, and the park-versus-completion race."""

from __future__ import annotations

from functools import partial

import pytest

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.deferreds import Completion
from runfleet.store.errors import InvalidInput
from runfleet.store.journal_records import WakeCause
from runfleet.store.types import (
    AlreadySatisfied,
    DeferredCompleted,
    GuardFailed,
    NotFound,
    NotOwner,
    NotWaiting,
    OnParentExit,
    Parked,
    RunStatus,
    Stolen,
    Waiting,
    WaitingReason,
    WaitingRow,
    Woken,
)
from runfleet.store.values import text_digest
from runfleet.store.waits import token_hash
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    activate,
    counts,
    create,
    extra_stores,
    journal_kinds,
    make_parked,
    make_running,
    must_get,
    race_pair,
    row_lock_gate,
    wait_db_time_past,
)

ITERATIONS = 60

# ---- park --------------------------------------------------------------------


async def test_park_suspends_the_run_and_records_the_wait(store: Store) -> None:
    await make_running(store, "r1")
    waiting = Waiting(WaitingReason.APPROVAL, wake_at_ms=5_000, token="tok", request={"amount": 10})
    outcome = await store.waits.park("r1", OWNER_A, 1, waiting, deferred="approval:manager")
    assert outcome == Parked(WaitingRow("r1", WaitingReason.APPROVAL, 5_000, "tok", {"amount": 10}))
    row = await must_get(store, "r1")
    assert row.status is RunStatus.SUSPENDED
    assert row.owner is None and row.heartbeat_at_ms is None and row.epoch == 1
    assert row.waiting == waiting
    assert await store.waits.waiting("r1") == WaitingRow(
        "r1", WaitingReason.APPROVAL, 5_000, "tok", {"amount": 10}
    )
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "parked"
    assert record.payload == {
        "reason": "approval",
        "wake_at_ms": 5_000,
        "token": "tok",
        "deferred": "approval:manager",
        "epoch": 1,
    }


async def test_park_is_owner_fenced(store: Store) -> None:
    running = await make_running(store, "r1")
    await create(store, "pending")
    assert isinstance(
        await store.waits.park("r1", OWNER_B, 1, Waiting(WaitingReason.EVENT)), NotOwner
    )
    assert isinstance(
        await store.waits.park("r1", OWNER_A, 2, Waiting(WaitingReason.EVENT)), NotOwner
    )
    assert isinstance(
        await store.waits.park("pending", OWNER_A, 0, Waiting(WaitingReason.EVENT)), NotOwner
    )
    assert await store.waits.park("ghost", OWNER_A, 1, Waiting(WaitingReason.EVENT)) == NotFound(
        "ghost"
    )
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    stolen = await store.runs.steal(
        "r1", running.snapshot, OWNER_B, jr.ProbeEvidence(), stale_after_ms=0
    )
    assert isinstance(stolen, Stolen)
    assert isinstance(
        await store.waits.park("r1", OWNER_A, 1, Waiting(WaitingReason.EVENT)), NotOwner
    )
    row = await must_get(store, "r1")
    assert row.status is RunStatus.RUNNING and row.owner == OWNER_B and row.waiting is None
    assert "parked" not in await journal_kinds(store, "r1")


async def test_park_with_a_cancel_request_is_guard_failed(store: Store) -> None:
    await make_running(store, "r1")
    await store.lifecycle.request_cancel("r1")
    outcome = await store.waits.park("r1", OWNER_A, 1, Waiting(WaitingReason.EVENT))
    assert isinstance(outcome, GuardFailed)
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING
    released = await store.waits.park(
        "r1", OWNER_A, 1, Waiting(WaitingReason.RELEASED), guard=False
    )
    assert isinstance(released, Parked)


async def test_park_on_an_already_completed_deferred_keeps_running(store: Store) -> None:
    await make_running(store, "r1")
    await store.deferreds.complete_deferred("r1", "evt", {"v": 1})
    outcome = await store.waits.park("r1", OWNER_A, 1, Waiting(WaitingReason.EVENT), deferred="evt")
    assert outcome == AlreadySatisfied("evt")
    row = await must_get(store, "r1")
    assert row.status is RunStatus.RUNNING and row.owner == OWNER_A and row.waiting is None
    assert "parked" not in await journal_kinds(store, "r1")


async def test_completion_after_a_park_wakes_the_run(store: Store) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.EVENT), deferred="evt")
    other = await store.deferreds.complete_deferred("r1", "unrelated", 0)
    assert other.woke is False
    assert (await must_get(store, "r1")).waiting is not None
    done = await store.deferreds.complete_deferred("r1", "evt", {"v": 1})
    assert isinstance(done.outcome, DeferredCompleted) and done.woke is True
    row = await must_get(store, "r1")
    assert row.status is RunStatus.SUSPENDED and row.waiting is None
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "deferred-completed"
    assert record.payload == {"name": "evt", "woke": True, "digest": text_digest('{"v":1}')}
    assert (await activate(store, "r1", OWNER_B)).epoch == 2


async def test_completion_does_not_wake_a_quarantined_run(store: Store) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.QUARANTINE), deferred="evt")
    done = await store.deferreds.complete_deferred("r1", "evt", 1)
    assert done.woke is False
    assert (await must_get(store, "r1")).waiting == Waiting(WaitingReason.QUARANTINE)


# ---- wake --------------------------------------------------------------------


async def test_wake_clears_the_wait_and_reports_what_it_was(store: Store) -> None:
    await make_parked(
        store, "r1", Waiting(WaitingReason.TIMER, wake_at_ms=7, token="t", request=[1])
    )
    outcome = await store.waits.wake("r1", cause=WakeCause.WAKE)
    assert outcome == Woken(WaitingRow("r1", WaitingReason.TIMER, 7, "t", [1]))
    row = await must_get(store, "r1")
    assert row.waiting is None and row.status is RunStatus.SUSPENDED
    assert await store.waits.waiting("r1") is None
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "woken" and record.payload == {"reason": "timer", "cause": "wake"}
    assert await store.waits.wake("r1") == NotWaiting("r1")


async def test_wake_of_a_run_not_waiting_or_unknown(store: Store) -> None:
    await make_running(store, "r1")
    assert await store.waits.wake("r1") == NotWaiting("r1")
    assert await store.waits.wake("ghost") == NotFound("ghost")
    assert "woken" not in await journal_kinds(store, "r1")


async def test_wake_of_a_delayed_admission(store: Store) -> None:
    await create(store, "r1", delay_until_ms=10**15)
    assert isinstance(await store.waits.wake("r1"), Woken)
    assert (await activate(store, "r1")).status is RunStatus.RUNNING


# ---- waiting queries ---------------------------------------------------------


async def _waiting_population(store: Store) -> None:
    await make_parked(store, "w-early-timer", Waiting(WaitingReason.TIMER, wake_at_ms=100))
    await make_parked(store, "w-late-timer", Waiting(WaitingReason.TIMER, wake_at_ms=10**15))
    await make_parked(store, "w-event", Waiting(WaitingReason.EVENT))
    await make_parked(
        store, "w-approval", Waiting(WaitingReason.APPROVAL, wake_at_ms=50, token="k")
    )
    await make_parked(store, "w-tie-b", Waiting(WaitingReason.QUOTA, wake_at_ms=100))
    await make_running(store, "not-waiting")
    await store.lifecycle.request_cancel("w-approval")


async def _ids(rows: list[WaitingRow]) -> list[str]:
    return [r.run_id for r in rows]


async def test_waiting_runs_orders_earliest_wake_first_and_untimed_last(store: Store) -> None:
    await _waiting_population(store)
    assert await _ids(await store.waits.waiting_runs()) == [
        "w-approval",
        "w-early-timer",
        "w-tie-b",
        "w-late-timer",
        "w-event",
    ]
    assert await _ids(await store.waits.waiting_runs(limit=2)) == ["w-approval", "w-early-timer"]


async def test_waiting_runs_filters(store: Store) -> None:
    await _waiting_population(store)
    waits = store.waits
    assert await _ids(await waits.waiting_runs(reason="timer")) == [
        "w-early-timer",
        "w-late-timer",
    ]
    assert await _ids(await waits.waiting_runs(due_before_ms=100)) == [
        "w-approval",
        "w-early-timer",
        "w-tie-b",
    ]
    assert await _ids(await waits.waiting_runs(due_before_ms=99)) == ["w-approval"]
    assert await _ids(await waits.waiting_runs(due_now=True)) == [
        "w-approval",
        "w-early-timer",
        "w-tie-b",
    ]
    assert await _ids(await waits.waiting_runs(cancel_requested=True)) == ["w-approval"]
    assert await _ids(await waits.waiting_runs(cancel_requested=False)) == [
        "w-early-timer",
        "w-tie-b",
        "w-late-timer",
        "w-event",
    ]
    assert await _ids(await waits.waiting_runs(reason="quota", due_now=True)) == ["w-tie-b"]
    assert await waits.waiting_runs(reason="nothing-like-this") == []


async def test_waiting_runs_forgets_woken_and_settled_runs(store: Store) -> None:
    await _waiting_population(store)
    await store.waits.wake("w-event")
    await store.waits.wake("w-late-timer")
    await activate(store, "w-late-timer", OWNER_B)
    await store.lifecycle.transition_owned("w-late-timer", OWNER_B, 2, RunStatus.COMPLETED)
    remaining = await _ids(await store.waits.waiting_runs())
    assert remaining == ["w-approval", "w-early-timer", "w-tie-b"]


async def test_waiting_tree_follows_attached_children_and_later_rounds(store: Store) -> None:
    # r0 (settled round) -> r1 (next round, parked on its child)
    #   r1 -> kid (attached, parked) -> grandkid (attached, parked)
    #   r1 -> loner (detached, parked) -> loner-kid (attached to loner, parked)
    #   r1 -> finished (attached, completed)
    await make_running(store, "r0", lineage_id="lin")
    await store.lifecycle.transition_owned("r0", OWNER_A, 1, RunStatus.COMPLETED)
    await make_parked(
        store,
        "r1",
        Waiting(WaitingReason.CHILD),
        lineage_id="lin",
        round_ordinal=1,
        previous_round_id="r0",
    )
    await make_parked(store, "kid", Waiting(WaitingReason.EVENT), parent_id="r1")
    await make_parked(
        store, "grandkid", Waiting(WaitingReason.APPROVAL, token="g"), parent_id="kid"
    )
    await make_parked(
        store,
        "loner",
        Waiting(WaitingReason.EVENT),
        parent_id="r1",
        on_parent_exit=OnParentExit.DETACH,
    )
    await make_parked(
        store, "loner-kid", Waiting(WaitingReason.TIMER, wake_at_ms=1), parent_id="loner"
    )
    await make_running(store, "finished", parent_id="r1")
    await store.lifecycle.transition_owned("finished", OWNER_A, 1, RunStatus.COMPLETED)

    tree = await store.waits.waiting_tree("r0")
    assert [(w.run_id, w.depth) for w in tree] == [("r1", 1), ("kid", 2), ("grandkid", 3)]
    assert tree[2].reason == "approval" and tree[2].token == "g"

    from_r1 = await store.waits.waiting_tree("r1")
    assert [(w.run_id, w.depth) for w in from_r1] == [("r1", 0), ("kid", 1), ("grandkid", 2)]

    wide = await store.waits.waiting_tree("r1", include_detached=True)
    assert [(w.run_id, w.depth) for w in wide] == [
        ("r1", 0),
        ("kid", 1),
        ("loner", 1),
        ("grandkid", 2),
        ("loner-kid", 2),
    ]


async def test_waiting_tree_lists_nothing_for_a_settled_leaf(store: Store) -> None:
    await make_running(store, "r1")
    await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert await store.waits.waiting_tree("r1") == []
    assert await store.waits.waiting_tree("ghost") == []


async def test_waiting_tree_lists_a_diamond_child_once(store: Store) -> None:
    await make_parked(store, "top", Waiting(WaitingReason.CHILD))
    await make_parked(store, "left", Waiting(WaitingReason.CHILD), parent_id="top")
    await make_parked(store, "right", Waiting(WaitingReason.CHILD), parent_id="top")
    await make_parked(store, "bottom", Waiting(WaitingReason.EVENT), parent_id="left")
    await store.dag.record_parent("bottom", "right")
    tree = await store.waits.waiting_tree("top")
    assert [(w.run_id, w.depth) for w in tree] == [
        ("top", 0),
        ("left", 1),
        ("right", 1),
        ("bottom", 2),
    ]


# ---- the race ----------------------------------------------------------------


async def test_race_completion_against_park_is_never_lost(
    settings: Settings, store: Store, database_url: str
) -> None:
    seen: set[str] = set()
    async with extra_stores(settings, 2) as (parker, completer):
        for i in range(ITERATIONS):
            run_id = f"race-{i}"
            await make_running(store, run_id)

            parked, completion = await race_pair(
                partial(
                    parker.waits.park,
                    run_id,
                    OWNER_A,
                    1,
                    Waiting(WaitingReason.EVENT),
                    deferred="evt",
                ),
                partial(completer.deferreds.complete_deferred, run_id, "evt", {"i": run_id}),
                second_starts_first=i % 2 == 1,
                gate=row_lock_gate(database_url, run_id) if i % 4 < 2 else None,
            )

            assert isinstance(completion, Completion), completion
            assert isinstance(completion.outcome, DeferredCompleted)
            row = await must_get(store, run_id)
            assert row.waiting is None, f"completion lost: {parked!r} {completion!r}"
            if isinstance(parked, AlreadySatisfied):
                assert completion.woke is False
                assert row.status is RunStatus.RUNNING and row.owner == OWNER_A
                seen.add("satisfied")
            else:
                assert isinstance(parked, Parked), parked
                assert completion.woke is True, "a parked run's completion must wake it"
                assert row.status is RunStatus.SUSPENDED
                seen.add("woken")
            deferred = await store.deferreds.deferred(run_id, "evt")
            assert deferred is not None and deferred.value == {"i": run_id}
    assert seen == {"satisfied", "woken"}, "both orders must have been exercised"


# ---- approvals ---------------------------------------------------------------


async def test_answer_approval_needs_the_pending_token(store: Store) -> None:
    await make_parked(
        store,
        "r1",
        Waiting(WaitingReason.APPROVAL, token="tok-1", request={"amount": 3}),
        deferred="appr",
    )
    assert (
        await store.deferreds.answer_approval("r1", "wrong", approved=True, actor="alice") is None
    )
    assert (await must_get(store, "r1")).waiting is not None
    done = await store.deferreds.answer_approval(
        "r1", "tok-1", approved=True, value={"limit": 9}, actor="alice", reason="fine"
    )
    assert done is not None and done.woke is True
    assert isinstance(done.outcome, DeferredCompleted)
    assert done.outcome.row.value == {
        "approved": True,
        "value": {"limit": 9},
        "actor": "postgres",  # the authenticated role decides; "alice" is a note
        "reason": "fine",
    }
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "approval-approved"
    assert record.payload == {
        "token": token_hash("tok-1"),
        "actor": "postgres",
        "note": "alice",
        "reason": "fine",
    }
    # Answered: the token is no longer pending, a second answer changes nothing.
    assert await store.deferreds.answer_approval("r1", "tok-1", approved=False, actor="bob") is None
    kept = await store.deferreds.deferred("r1", "appr")
    assert kept is not None and kept.value["approved"] is True


async def test_a_denial_is_journaled_as_such(store: Store) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.APPROVAL, token="t"), deferred="appr")
    done = await store.deferreds.answer_approval("r1", "t", approved=False, actor="bob")
    assert done is not None and done.woke is True
    assert (await store.journal.last("r1", limit=1))[0].kind == "approval-denied"


async def test_answer_approval_refuses_a_run_not_awaiting_approval(
    store: Store, database_url: str
) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.EVENT, token="t"), deferred="evt")
    assert await store.deferreds.answer_approval("r1", "t", approved=True, actor="alice") is None
    before = await counts(database_url)
    with pytest.raises(InvalidInput) as caught:
        await store.deferreds.answer_approval("ghost", "t", approved=True, actor="alice")
    assert caught.value.field == "run_id"
    with pytest.raises(InvalidInput) as caught:
        await store.deferreds.answer_approval("r1", "t", approved=True, actor="")
    assert caught.value.field == "actor"
    assert await counts(database_url) == before
