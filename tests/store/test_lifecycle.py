"""Owned transitions (fencing, guard, settlement side effects) and lease heartbeats."""

from __future__ import annotations

import pytest

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.errors import InvalidInput
from runfleet.store.types import (
    Activated,
    ClockScheduled,
    GuardFailed,
    NotFound,
    NotOwner,
    OnParentExit,
    Owner,
    Reconfirmation,
    RunStatus,
    Stolen,
    Transitioned,
    Waiting,
    WaitingReason,
    Woken,
)
from tests.store.helpers import (
    NOBODY,
    OWNER_A,
    OWNER_B,
    activate,
    create,
    journal_kinds,
    make_parked,
    make_running,
    must_get,
    wait_db_time_past,
)


class Boom(Exception):
    """Raised on purpose to roll back an outer transaction."""


# ---- transition_owned --------------------------------------------------------


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED])
async def test_terminal_transition_settles_and_drops_the_owner(
    store: Store, status: RunStatus
) -> None:
    running = await make_running(store, "r1")
    outcome = await store.lifecycle.transition_owned(
        "r1", OWNER_A, running.epoch, status, state_patch={"result": {"ok": True}}
    )
    assert isinstance(outcome, Transitioned)
    row = outcome.row
    assert row.status is status
    assert row.owner is None and row.heartbeat_at_ms is None
    assert row.epoch == 1, "the epoch stays as fence history"
    assert row.result == {"ok": True}
    assert row.payload is None and row.state["on_parent_exit"] == "cancel", "patch merges"
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "transitioned"
    assert record.payload == {"to": status.value, "epoch": 1}


async def test_transition_accepts_a_status_string_and_a_custom_record(store: Store) -> None:
    await make_running(store, "r1")
    outcome = await store.lifecycle.transition_owned(
        "r1",
        OWNER_A,
        1,
        "failed",  # type: ignore[arg-type]  # callers outside the enum pass plain strings
        record=jr.LineageExhausted(max_rounds=3),
    )
    assert isinstance(outcome, Transitioned) and outcome.row.status is RunStatus.FAILED
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "lineage-exhausted"
    assert record.payload == {"to": "failed", "epoch": 1, "max_rounds": 3}


async def test_settled_run_never_moves_again(store: Store) -> None:
    await make_running(store, "r1")
    done = await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert isinstance(done, Transitioned)
    again = await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.FAILED)
    assert isinstance(again, NotOwner) and again.current.status is RunStatus.COMPLETED
    unguarded = await store.lifecycle.transition_owned(
        "r1", OWNER_A, 1, RunStatus.CANCELLED, guard=False
    )
    assert isinstance(unguarded, NotOwner)
    assert (await must_get(store, "r1")).status is RunStatus.COMPLETED


async def test_transition_by_another_owner_is_refused(store: Store) -> None:
    await make_running(store, "r1")
    outcome = await store.lifecycle.transition_owned("r1", OWNER_B, 1, RunStatus.COMPLETED)
    assert isinstance(outcome, NotOwner)
    assert outcome.current.status is RunStatus.RUNNING and outcome.current.owner == OWNER_A
    assert "transitioned" not in await journal_kinds(store, "r1")


async def test_transition_with_a_stale_epoch_is_refused(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    stolen = await store.runs.steal(
        "r1", running.snapshot, OWNER_B, jr.ProbeEvidence(), stale_after_ms=0
    )
    assert isinstance(stolen, Stolen) and stolen.row.epoch == 2
    old = await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert isinstance(old, NotOwner)
    wrong_epoch = await store.lifecycle.transition_owned("r1", OWNER_B, 1, RunStatus.COMPLETED)
    assert isinstance(wrong_epoch, NotOwner)
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING
    ok = await store.lifecycle.transition_owned("r1", OWNER_B, 2, RunStatus.COMPLETED)
    assert isinstance(ok, Transitioned)


async def test_transition_of_a_run_not_running_is_refused(store: Store) -> None:
    await create(store, "r1")
    outcome = await store.lifecycle.transition_owned("r1", OWNER_A, 0, RunStatus.COMPLETED)
    assert isinstance(outcome, NotOwner) and outcome.current.status is RunStatus.PENDING


async def test_transition_of_an_unknown_run_is_not_found(store: Store) -> None:
    outcome = await store.lifecycle.transition_owned("ghost", OWNER_A, 1, RunStatus.COMPLETED)
    assert outcome == NotFound("ghost")


async def test_guard_turns_a_settlement_after_a_cancel_request_into_guard_failed(
    store: Store,
) -> None:
    await make_running(store, "r1")
    await store.lifecycle.request_cancel("r1")
    for status in (RunStatus.COMPLETED, RunStatus.FAILED):
        outcome = await store.lifecycle.transition_owned("r1", OWNER_A, 1, status)
        assert isinstance(outcome, GuardFailed)
        assert outcome.current.status is RunStatus.RUNNING
    parked = await store.lifecycle.transition_owned(
        "r1", OWNER_A, 1, RunStatus.SUSPENDED, waiting=Waiting(WaitingReason.EVENT)
    )
    assert isinstance(parked, GuardFailed)
    # A non-owner still learns it is not the owner, not that a cancel is pending.
    assert isinstance(
        await store.lifecycle.transition_owned("r1", OWNER_B, 1, RunStatus.COMPLETED), NotOwner
    )
    unguarded = await store.lifecycle.transition_owned(
        "r1", OWNER_A, 1, RunStatus.FAILED, guard=False
    )
    assert isinstance(unguarded, Transitioned) and unguarded.row.status is RunStatus.FAILED


async def test_suspended_transition_requires_and_stores_a_waiting(store: Store) -> None:
    await make_running(store, "r1")
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.SUSPENDED)
    assert caught.value.field == "waiting"
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.transition_owned(
            "r1", OWNER_A, 1, RunStatus.COMPLETED, waiting=Waiting(WaitingReason.EVENT)
        )
    assert caught.value.field == "waiting"
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING

    waiting = Waiting(WaitingReason.APPROVAL, wake_at_ms=99, token="tok-1", request={"amount": 5})
    outcome = await store.lifecycle.transition_owned(
        "r1", OWNER_A, 1, RunStatus.SUSPENDED, waiting=waiting
    )
    assert isinstance(outcome, Transitioned)
    row = outcome.row
    assert row.status is RunStatus.SUSPENDED and row.owner is None
    assert row.waiting == waiting
    assert await store.waits.waiting("r1") is not None
    assert isinstance(await store.waits.wake("r1"), Woken)
    assert (await activate(store, "r1", OWNER_B)).epoch == 2


@pytest.mark.parametrize("status", [RunStatus.RUNNING, RunStatus.PENDING])
async def test_transition_back_to_running_or_pending_is_refused(
    store: Store, status: RunStatus
) -> None:
    await make_running(store, "r1")
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.transition_owned("r1", OWNER_A, 1, status)
    assert caught.value.field == "to_status"


async def _with_clocks(store: Store, run_id: str) -> None:
    for name in ("c1", "c2"):
        outcome = await store.waits.schedule_clock(run_id, name, f"d-{name}", 10**15, OWNER_A, 1)
        assert isinstance(outcome, ClockScheduled)


async def test_terminal_transition_closes_the_runs_clocks(store: Store) -> None:
    await make_running(store, "r1")
    await make_running(store, "other", OWNER_A)
    await _with_clocks(store, "r1")
    await _with_clocks(store, "other")
    await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert await store.waits.pending_clocks("r1") == []
    closed = await store.waits.clock("r1", "c1")
    assert closed is not None and closed.completed_at_ms is not None
    assert len(await store.waits.pending_clocks("other")) == 2


async def test_suspending_keeps_the_runs_clocks(store: Store) -> None:
    await make_running(store, "r1")
    await _with_clocks(store, "r1")
    await store.lifecycle.transition_owned(
        "r1",
        OWNER_A,
        1,
        RunStatus.SUSPENDED,
        waiting=Waiting(WaitingReason.TIMER, wake_at_ms=10**15),
    )
    assert len(await store.waits.pending_clocks("r1")) == 2


async def _family(store: Store) -> None:
    """parent(running A) -> attached pending, attached running(B), detached pending;
    attached pending -> attached grandchild; detached -> attached grandchild."""
    await make_running(store, "parent")
    await create(store, "att", parent_id="parent")
    await create(store, "att-gc", parent_id="att")
    await create(store, "att-run", parent_id="parent")
    await activate(store, "att-run", OWNER_B)
    await create(store, "det", parent_id="parent", on_parent_exit=OnParentExit.DETACH)
    await create(store, "det-gc", parent_id="det")


async def test_terminal_transition_cascades_to_attached_not_detached_children(
    store: Store,
) -> None:
    await _family(store)
    outcome = await store.lifecycle.transition_owned("parent", OWNER_A, 1, RunStatus.COMPLETED)
    assert isinstance(outcome, Transitioned)

    for asked in ("att", "att-gc"):  # asked only: each closes through its own cancel path
        row = await must_get(store, asked)
        assert row.status is RunStatus.PENDING and row.cancel_requested_at_ms is not None
        record = (await store.journal.last(asked, limit=1))[0]
        assert record.kind == "cancel-requested"
        assert record.payload == {"actor": "postgres", "cause": "parent-completed", "by": "parent"}
    running = await must_get(store, "att-run")
    assert running.status is RunStatus.RUNNING and running.owner == OWNER_B
    assert running.cancel_requested_at_ms is not None
    for untouched in ("det", "det-gc"):
        row = await must_get(store, untouched)
        assert row.status is RunStatus.PENDING and row.cancel_requested_at_ms is None

    policy = (await store.journal.last("parent", limit=1))[0]
    assert policy.kind == "child-policy-applied"
    assert policy.payload["cause"] == "parent-completed"
    assert sorted(policy.payload["cascaded_to"]) == ["att", "att-gc", "att-run"]


async def test_cascade_leaves_a_parked_childs_clocks_to_its_own_cancel(store: Store) -> None:
    await make_running(store, "parent")
    await make_running(store, "child", OWNER_B, parent_id="parent")
    await store.waits.schedule_clock("child", "c", "d", 10**15, OWNER_B, 1)
    await store.waits.park("child", OWNER_B, 1, Waiting(WaitingReason.TIMER, wake_at_ms=10**15))
    await store.lifecycle.transition_owned("parent", OWNER_A, 1, RunStatus.FAILED)
    child = await must_get(store, "child")
    assert child.status is RunStatus.SUSPENDED and child.cancel_requested_at_ms is not None
    # Its owner-to-be closes it (acknowledge_cancel closes the clocks in that statement).
    await store.waits.wake("child")
    woken = await must_get(store, "child")
    activated = await store.runs.claim_and_activate("child", woken.snapshot, OWNER_A)
    assert isinstance(activated, Activated)
    await store.lifecycle.acknowledge_cancel("child", OWNER_A, activated.row.epoch)
    assert (await must_get(store, "child")).status is RunStatus.CANCELLED
    assert await store.waits.pending_clocks("child") == []


async def test_non_terminal_transition_does_not_cascade(store: Store) -> None:
    await _family(store)
    await store.lifecycle.transition_owned(
        "parent", OWNER_A, 1, RunStatus.SUSPENDED, waiting=Waiting(WaitingReason.CHILD)
    )
    for child in ("att", "att-gc", "att-run"):
        assert (await must_get(store, child)).cancel_requested_at_ms is None


async def test_settlement_and_its_consequences_roll_back_together(store: Store) -> None:
    await _family(store)
    await _with_clocks(store, "parent")
    kinds_before = await journal_kinds(store, "parent")
    with pytest.raises(Boom):
        async with store.transaction():
            done = await store.lifecycle.transition_owned("parent", OWNER_A, 1, RunStatus.COMPLETED)
            assert isinstance(done, Transitioned)
            raise Boom
    parent = await must_get(store, "parent")
    assert parent.status is RunStatus.RUNNING and parent.owner == OWNER_A
    assert len(await store.waits.pending_clocks("parent")) == 2
    assert (await must_get(store, "att")).status is RunStatus.PENDING
    assert (await must_get(store, "att-run")).cancel_requested_at_ms is None
    assert await journal_kinds(store, "parent") == kinds_before
    assert await journal_kinds(store, "att") == ["created", "parent-recorded"]


# ---- heartbeat ---------------------------------------------------------------


async def test_heartbeat_renews_with_database_time(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    beat = await store.runs.heartbeat(OWNER_A, ["r1"])
    assert beat.confirmed == {"r1"} and beat.cancel_requested == frozenset()
    row = await must_get(store, "r1")
    assert row.heartbeat_at_ms is not None
    assert running.heartbeat_at_ms < row.heartbeat_at_ms <= beat.now_ms


async def test_heartbeat_confirms_only_runs_still_fenced_to_the_caller(store: Store) -> None:
    await make_running(store, "mine-1")
    await make_running(store, "mine-2")
    await make_running(store, "theirs", OWNER_B)
    await make_parked(store, "parked", Waiting(WaitingReason.EVENT))
    await create(store, "pending")
    theirs_before = (await must_get(store, "theirs")).heartbeat_at_ms
    beat = await store.runs.heartbeat(
        OWNER_A, ["mine-1", "mine-2", "theirs", "parked", "pending", "ghost"]
    )
    assert beat.confirmed == {"mine-1", "mine-2"}
    assert (await must_get(store, "theirs")).heartbeat_at_ms == theirs_before


async def test_heartbeat_of_nothing_reports_database_time(store: Store) -> None:
    row = await create(store, "r1")
    beat = await store.runs.heartbeat(OWNER_A, [])
    assert beat.confirmed == frozenset() and beat.cancel_requested == frozenset()
    assert beat.now_ms >= row.created_at_ms


async def test_heartbeat_after_a_steal_drops_the_run_from_the_old_owner(store: Store) -> None:
    running = await make_running(store, "r1")
    await make_running(store, "r2")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    stolen = await store.runs.steal(
        "r1", running.snapshot, OWNER_B, jr.ProbeEvidence(), stale_after_ms=0
    )
    assert isinstance(stolen, Stolen)
    old = await store.runs.heartbeat(OWNER_A, ["r1", "r2"])
    assert old.confirmed == {"r2"}
    assert (await must_get(store, "r1")).heartbeat_at_ms == stolen.row.heartbeat_at_ms
    new = await store.runs.heartbeat(OWNER_B, ["r1"])
    assert new.confirmed == {"r1"}


async def test_a_reconfirming_heartbeat_journals_only_runs_it_renews_at_their_epoch(
    store: Store,
) -> None:
    """lease-reconfirmed is written by the renewal statement itself, fenced: not on a run
    stolen meanwhile, not on one held at another epoch than the process believes."""
    running = await make_running(store, "stolen")
    await make_running(store, "kept")
    await make_running(store, "other-epoch")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    assert isinstance(
        await store.runs.steal(
            "stolen", running.snapshot, OWNER_B, jr.ProbeEvidence(), stale_after_ms=0
        ),
        Stolen,
    )
    beat = await store.runs.heartbeat(
        OWNER_A,
        ["stolen", "kept", "other-epoch"],
        reconfirm=Reconfirmation(
            epochs={"stolen": 1, "kept": 1, "other-epoch": 7}, unconfirmed_ms=4321
        ),
    )
    assert beat.confirmed == {"kept", "other-epoch"} and beat.reconfirmed == {"kept"}
    records = {
        run_id: [r for r in await store.journal.records(run_id) if r.kind == "lease-reconfirmed"]
        for run_id in ("stolen", "kept", "other-epoch")
    }
    assert records["stolen"] == [] and records["other-epoch"] == []
    (kept,) = records["kept"]
    assert kept.payload == {
        "owner": OWNER_A.key,
        "epoch": 1,
        "confirmed_ms": beat.now_ms,
        "unconfirmed_ms": 4321,
    }
    plain = await store.runs.heartbeat(OWNER_A, ["kept"])  # an ordinary renewal writes nothing
    assert plain.reconfirmed == frozenset()
    assert (await journal_kinds(store, "kept")).count("lease-reconfirmed") == 1


async def test_heartbeat_reports_cancel_requests(store: Store) -> None:
    await make_running(store, "r1")
    await make_running(store, "r2")
    await store.lifecycle.request_cancel("r2")
    beat = await store.runs.heartbeat(OWNER_A, ["r1", "r2"])
    assert beat.confirmed == {"r1", "r2"}
    assert beat.cancel_requested == {"r2"}


async def test_heartbeat_from_a_different_process_with_the_same_pid_is_not_the_owner(
    store: Store,
) -> None:
    await make_running(store, "r1")
    reborn = Owner(OWNER_A.host_id, OWNER_A.pid, "new-nonce")
    assert (await store.runs.heartbeat(reborn, ["r1"])).confirmed == frozenset()
    assert (await store.runs.heartbeat(NOBODY, ["r1"])).confirmed == frozenset()
