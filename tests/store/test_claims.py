"""The claim / activate / steal compare-and-swap family, its journal evidence, and its races."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import pytest

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.steps import StepWrite
from runfleet.store.types import (
    Activated,
    Claimed,
    ClaimRecovered,
    DeadLettered,
    LeaseFresh,
    NotFound,
    NotOwner,
    Owner,
    Parked,
    RunRow,
    RunStatus,
    Snapshot,
    SnapshotChanged,
    Stolen,
    Waiting,
    WaitingReason,
    Woken,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    OWNER_C,
    activate,
    create,
    extra_stores,
    journal_kinds,
    make_parked,
    make_running,
    must_get,
    race,
    row_lock_gate,
    wait_db_time_past,
)

PROBE = jr.ProbeEvidence(probe="same-host-pid-dead", observer=OWNER_B.key)

# ---- claim -------------------------------------------------------------------


async def test_claim_records_the_claimant_without_activating(store: Store) -> None:
    row = await create(store, "r1")
    outcome = await store.runs.claim("r1", row.snapshot, OWNER_A)
    assert isinstance(outcome, Claimed)
    claimed = outcome.row
    assert claimed.status is RunStatus.PENDING
    assert claimed.claim == OWNER_A and claimed.claimed_at_ms is not None
    assert claimed.owner is None and claimed.epoch == 0
    records = await store.journal.records("r1")
    assert [r.kind for r in records] == ["created", "claimed"]
    assert records[-1].payload == {"claimant": OWNER_A.key}


async def test_claim_with_a_stale_snapshot_loses(store: Store) -> None:
    row = await create(store, "r1")
    assert isinstance(await store.runs.claim("r1", row.snapshot, OWNER_A), Claimed)
    late = await store.runs.claim("r1", row.snapshot, OWNER_B)
    assert isinstance(late, SnapshotChanged)
    assert late.current.claim == OWNER_A
    assert await journal_kinds(store, "r1") == ["created", "claimed"]


async def test_claim_of_an_already_claimed_row_loses_even_with_its_snapshot(store: Store) -> None:
    row = await create(store, "r1")
    claimed = await store.runs.claim("r1", row.snapshot, OWNER_A)
    assert isinstance(claimed, Claimed)
    again = await store.runs.claim("r1", claimed.row.snapshot, OWNER_B)
    assert isinstance(again, SnapshotChanged)
    assert again.current.claim == OWNER_A


async def test_claim_of_a_running_row_loses(store: Store) -> None:
    running = await make_running(store, "r1")
    outcome = await store.runs.claim("r1", running.snapshot, OWNER_B)
    assert isinstance(outcome, SnapshotChanged)
    assert outcome.current.owner == OWNER_A and outcome.current.claim is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: replace(s, status=RunStatus.SUSPENDED),
        lambda s: replace(s, owner=OWNER_C),
        lambda s: replace(s, heartbeat_at_ms=12345),
    ],
    ids=["status", "owner", "heartbeat"],
)
async def test_claim_compares_every_snapshot_field(
    store: Store, mutate: Callable[[Snapshot], Snapshot]
) -> None:
    row = await create(store, "r1")
    wrong = mutate(row.snapshot)
    for op in (store.runs.claim, store.runs.claim_and_activate):
        outcome = await op("r1", wrong, OWNER_A)
        assert isinstance(outcome, SnapshotChanged), outcome
    assert (await must_get(store, "r1")).claim is None


async def test_claim_of_an_unknown_run_is_not_found(store: Store) -> None:
    snapshot = Snapshot(RunStatus.PENDING, None, None, None)
    assert await store.runs.claim("ghost", snapshot, OWNER_A) == NotFound("ghost")
    assert await store.runs.claim_and_activate("ghost", snapshot, OWNER_A) == NotFound("ghost")


# ---- activate ----------------------------------------------------------------


async def test_activate_moves_the_claim_to_ownership_and_bumps_the_epoch(store: Store) -> None:
    row = await create(store, "r1")
    claimed = await store.runs.claim("r1", row.snapshot, OWNER_A)
    assert isinstance(claimed, Claimed) and claimed.row.claimed_at_ms is not None
    outcome = await store.runs.activate("r1", OWNER_A, claimed.row.claimed_at_ms)
    assert isinstance(outcome, Activated)
    active = outcome.row
    assert active.status is RunStatus.RUNNING and active.owner == OWNER_A
    assert active.epoch == 1 and active.claim is None and active.claimed_at_ms is None
    assert active.heartbeat_at_ms is not None
    records = await store.journal.records("r1")
    assert [r.kind for r in records] == ["created", "claimed", "activated"]
    assert records[-1].payload == {"owner": OWNER_A.key, "epoch": 1}


async def test_activate_by_someone_else_or_with_another_claim_time_loses(store: Store) -> None:
    row = await create(store, "r1")
    claimed = await store.runs.claim("r1", row.snapshot, OWNER_A)
    assert isinstance(claimed, Claimed) and claimed.row.claimed_at_ms is not None
    at = claimed.row.claimed_at_ms
    assert isinstance(await store.runs.activate("r1", OWNER_B, at), SnapshotChanged)
    assert isinstance(await store.runs.activate("r1", OWNER_A, at - 1), SnapshotChanged)
    assert await store.runs.activate("ghost", OWNER_A, at) == NotFound("ghost")
    current = await must_get(store, "r1")
    assert current.status is RunStatus.PENDING and current.claim == OWNER_A
    assert isinstance(await store.runs.activate("r1", OWNER_A, at), Activated)
    assert isinstance(await store.runs.activate("r1", OWNER_A, at), SnapshotChanged)


# ---- claim_and_activate ------------------------------------------------------


async def test_claim_and_activate_is_one_step_with_one_record(store: Store) -> None:
    row = await create(store, "r1")
    outcome = await store.runs.claim_and_activate("r1", row.snapshot, OWNER_A)
    assert isinstance(outcome, Activated)
    assert outcome.row.status is RunStatus.RUNNING and outcome.row.owner == OWNER_A
    assert outcome.row.epoch == 1 and outcome.row.heartbeat_at_ms == outcome.row.updated_at_ms
    records = await store.journal.records("r1")
    assert [r.kind for r in records] == ["created", "claimed-and-activated"]
    assert records[-1].payload == {"owner": OWNER_A.key, "epoch": 1, "from": "pending"}
    again = await store.runs.claim_and_activate("r1", row.snapshot, OWNER_B)
    assert isinstance(again, SnapshotChanged) and again.current.owner == OWNER_A


async def test_every_activation_bumps_the_epoch(store: Store) -> None:
    running = await make_running(store, "r1")
    epochs = [running.epoch]
    for owner in (OWNER_B, OWNER_C, OWNER_A):
        current = await must_get(store, "r1")
        assert current.owner is not None
        parked = await store.waits.park(
            "r1", current.owner, current.epoch, Waiting(WaitingReason.EVENT)
        )
        assert isinstance(parked, Parked), parked
        assert isinstance(await store.waits.wake("r1"), Woken)
        resumed = await activate(store, "r1", owner)
        epochs.append(resumed.epoch)
    assert epochs == [1, 2, 3, 4]
    records = await store.journal.records("r1")
    activations = [r for r in records if r.kind == "claimed-and-activated"]
    assert [r.payload["from"] for r in activations] == ["pending", *["suspended"] * 3]
    assert [r.payload["epoch"] for r in activations] == [1, 2, 3, 4]


async def test_parked_row_is_not_claimable_until_woken(store: Store) -> None:
    parked = await make_parked(store, "r1", Waiting(WaitingReason.EVENT))
    assert parked.waiting is not None
    for op in (store.runs.claim, store.runs.claim_and_activate):
        refused = await op("r1", parked.snapshot, OWNER_B)
        assert isinstance(refused, SnapshotChanged), refused
    await store.waits.wake("r1")
    woken = await must_get(store, "r1")
    assert woken.status is RunStatus.SUSPENDED and woken.waiting is None
    resumed = await store.runs.claim_and_activate("r1", woken.snapshot, OWNER_B)
    assert isinstance(resumed, Activated) and resumed.row.epoch == 2


async def test_delayed_admission_is_not_claimable_until_woken(store: Store) -> None:
    row = await create(store, "r1", delay_until_ms=1)
    refused = await store.runs.claim_and_activate("r1", row.snapshot, OWNER_A)
    assert isinstance(refused, SnapshotChanged)
    assert isinstance(await store.waits.wake("r1"), Woken)
    assert (await activate(store, "r1")).epoch == 1


# ---- steal -------------------------------------------------------------------


async def test_steal_of_a_fresh_lease_is_refused_by_database_time(store: Store) -> None:
    running = await make_running(store, "r1")
    outcome = await store.runs.steal("r1", running.snapshot, OWNER_B, PROBE)
    assert isinstance(outcome, LeaseFresh)
    assert outcome.current.owner == OWNER_A and outcome.current.epoch == 1
    assert "stolen-and-activated" not in await journal_kinds(store, "r1")


async def test_steal_of_a_stale_lease_takes_over_with_evidence(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    outcome = await store.runs.steal("r1", running.snapshot, OWNER_B, PROBE, stale_after_ms=0)
    assert isinstance(outcome, Stolen)
    assert outcome.previous == OWNER_A
    assert outcome.row.owner == OWNER_B and outcome.row.epoch == 2
    assert outcome.row.status is RunStatus.RUNNING
    assert outcome.row.heartbeat_at_ms is not None
    assert outcome.row.heartbeat_at_ms > running.heartbeat_at_ms
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "stolen-and-activated"
    assert record.payload["owner"] == OWNER_B.key
    assert record.payload["epoch"] == 2
    assert record.payload["previous_owner"] == OWNER_A.key
    assert record.payload["previous_heartbeat_at_ms"] == running.heartbeat_at_ms
    assert record.payload["lease_age_ms"] > 0
    assert record.payload["probe"] == "same-host-pid-dead"
    assert record.payload["observer"] == OWNER_B.key
    fenced = await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert isinstance(fenced, NotOwner)


async def test_steal_uses_the_configured_staleness_by_default(
    settings: Settings, store: Store
) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    fast = settings.model_copy(update={"stale_after": 0.001})
    async with extra_stores(fast, 1) as (thief,):
        await wait_db_time_past(store, running.heartbeat_at_ms + 1)
        outcome = await thief.runs.steal("r1", running.snapshot, OWNER_B, PROBE)
    assert isinstance(outcome, Stolen)


async def test_steal_after_the_owner_renewed_reports_the_change(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    renewed = await store.runs.heartbeat(OWNER_A, ["r1"])
    assert renewed.confirmed == {"r1"}
    await wait_db_time_past(store, renewed.now_ms)
    outcome = await store.runs.steal("r1", running.snapshot, OWNER_B, PROBE, stale_after_ms=0)
    assert isinstance(outcome, SnapshotChanged)
    assert outcome.current.owner == OWNER_A and outcome.current.epoch == 1


async def test_only_one_of_two_thieves_wins(store: Store) -> None:
    running = await make_running(store, "r1")
    assert running.heartbeat_at_ms is not None
    await wait_db_time_past(store, running.heartbeat_at_ms)
    first = await store.runs.steal("r1", running.snapshot, OWNER_B, PROBE, stale_after_ms=0)
    second = await store.runs.steal("r1", running.snapshot, OWNER_C, PROBE, stale_after_ms=0)
    assert isinstance(first, Stolen) and isinstance(second, SnapshotChanged)
    assert second.current.owner == OWNER_B


async def test_steal_requires_a_running_snapshot_with_an_owner(store: Store) -> None:
    row = await create(store, "r1")
    with pytest.raises(InvalidInput) as caught:
        await store.runs.steal("r1", row.snapshot, OWNER_B, PROBE)
    assert caught.value.field == "expected"
    assert await journal_kinds(store, "r1") == ["created"]


async def test_steal_of_an_unknown_run_is_not_found(store: Store) -> None:
    snapshot = Snapshot(RunStatus.RUNNING, OWNER_A, 1, None)
    assert await store.runs.steal("ghost", snapshot, OWNER_B, PROBE) == NotFound("ghost")


# ---- stranded claims ---------------------------------------------------------


async def _claimed(store: Store, run_id: str, claimant: Owner) -> int:
    row = await create(store, run_id)
    outcome = await store.runs.claim(run_id, row.snapshot, claimant)
    assert isinstance(outcome, Claimed) and outcome.row.claimed_at_ms is not None
    return outcome.row.claimed_at_ms


async def test_recover_claim_refuses_a_fresh_claim(store: Store) -> None:
    at = await _claimed(store, "r1", OWNER_A)
    outcome = await store.runs.recover_claim("r1", OWNER_A, at, PROBE)
    assert isinstance(outcome, SnapshotChanged)
    assert outcome.current.claim == OWNER_A


async def test_recover_claim_clears_a_stale_claim_with_evidence(
    settings: Settings, store: Store
) -> None:
    at = await _claimed(store, "r1", OWNER_A)
    fast = settings.model_copy(update={"stale_after": 0.001})
    async with extra_stores(fast, 1) as (sweeper,):
        await wait_db_time_past(store, at + 1)
        wrong = await sweeper.runs.recover_claim("r1", OWNER_C, at, PROBE)
        assert isinstance(wrong, SnapshotChanged)
        moved = await sweeper.runs.recover_claim("r1", OWNER_A, at - 1, PROBE)
        assert isinstance(moved, SnapshotChanged)
        outcome = await sweeper.runs.recover_claim("r1", OWNER_A, at, PROBE)
        assert isinstance(outcome, ClaimRecovered)
        assert outcome.row.claim is None and outcome.row.claimed_at_ms is None
        again = await sweeper.runs.recover_claim("r1", OWNER_A, at, PROBE)
        assert isinstance(again, SnapshotChanged)
        assert await sweeper.runs.recover_claim("ghost", OWNER_A, at, PROBE) == NotFound("ghost")
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "claim-recovered"
    assert record.payload == {"claimant": OWNER_A.key, "probe": PROBE.probe}
    # The dead claimant's activation now loses; a live worker claims afresh.
    assert isinstance(await store.runs.activate("r1", OWNER_A, at), SnapshotChanged)
    assert (await activate(store, "r1", OWNER_B)).owner == OWNER_B


async def test_abandon_claim_only_by_the_claimant(store: Store) -> None:
    await _claimed(store, "r1", OWNER_A)
    assert await store.runs.abandon_claim("r1", OWNER_B) is False
    assert (await must_get(store, "r1")).claim == OWNER_A
    assert await store.runs.abandon_claim("r1", OWNER_A) is True
    assert await store.runs.abandon_claim("r1", OWNER_A) is False
    assert await store.runs.abandon_claim("ghost", OWNER_A) is False
    row = await must_get(store, "r1")
    assert row.claim is None and row.status is RunStatus.PENDING
    assert await journal_kinds(store, "r1") == ["created", "claimed", "claim-abandoned"]
    assert (await activate(store, "r1", OWNER_B)).owner == OWNER_B


# ---- races -------------------------------------------------------------------

CLAIMANTS = [Owner(f"host-{k}", 1000 + k, f"nonce-{k}") for k in range(8)]
ITERATIONS = 50


async def test_race_claim_and_activate_has_exactly_one_winner(
    settings: Settings, store: Store, database_url: str
) -> None:
    async with extra_stores(settings, len(CLAIMANTS)) as stores:
        for i in range(ITERATIONS):
            run_id = f"race-{i}"
            snapshot = (await create(store, run_id)).snapshot
            gate = row_lock_gate(database_url, run_id) if i % 2 == 0 else None
            outcomes = await race(
                [
                    partial(s.runs.claim_and_activate, run_id, snapshot, me)
                    for s, me in zip(stores, CLAIMANTS, strict=True)
                ],
                gate=gate,
            )
            winners = [o for o in outcomes if isinstance(o, Activated)]
            assert len(winners) == 1, outcomes
            assert all(isinstance(o, SnapshotChanged) for o in outcomes if o not in winners)
            row = await must_get(store, run_id)
            assert row.owner == winners[0].row.owner and row.epoch == 1
            kinds = await journal_kinds(store, run_id)
            assert kinds == ["created", "claimed-and-activated"]


async def test_race_claim_has_exactly_one_winner(
    settings: Settings, store: Store, database_url: str
) -> None:
    async with extra_stores(settings, len(CLAIMANTS)) as stores:
        for i in range(ITERATIONS):
            run_id = f"race-{i}"
            snapshot = (await create(store, run_id)).snapshot
            gate = row_lock_gate(database_url, run_id) if i % 2 == 0 else None
            outcomes = await race(
                [
                    partial(s.runs.claim, run_id, snapshot, me)
                    for s, me in zip(stores, CLAIMANTS, strict=True)
                ],
                gate=gate,
            )
            winners = [o for o in outcomes if isinstance(o, Claimed)]
            assert len(winners) == 1, outcomes
            assert all(isinstance(o, SnapshotChanged) for o in outcomes if o not in winners)
            row = await must_get(store, run_id)
            assert row.claim == winners[0].row.claim and row.status is RunStatus.PENDING
            assert await journal_kinds(store, run_id) == ["created", "claimed"]


async def test_a_snapshot_from_an_earlier_tenure_loses_even_if_the_row_looks_alike(
    store: Store,
) -> None:
    """A suspended row reads the same across tenures; the epoch in the snapshot tells them apart."""
    from runfleet.store.types import Activated, NewRun, SnapshotChanged, Waiting

    a, b, c = Owner("h", 1, "a"), Owner("h", 2, "b"), Owner("h", 3, "c")
    created = await store.admission.create(NewRun(id="aba", flow="f"))
    first = await store.runs.claim_and_activate("aba", created.row.snapshot, a)
    assert isinstance(first, Activated)
    await store.waits.park("aba", a, first.row.epoch, Waiting(reason=WaitingReason.EVENT))
    await store.waits.wake("aba")
    stale_row = await store.runs.get("aba")
    assert stale_row is not None
    second = await store.runs.claim_and_activate("aba", stale_row.snapshot, b)
    assert isinstance(second, Activated)
    await store.waits.park("aba", b, second.row.epoch, Waiting(reason=WaitingReason.APPROVAL))
    await store.waits.wake("aba")
    outcome = await store.runs.claim_and_activate("aba", stale_row.snapshot, c)
    assert isinstance(outcome, SnapshotChanged)


# ---- poison runs: recoveries in a row, parked dead -----------------------------------


async def _stale(store: Store, row: RunRow) -> RunRow:
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms)
    return row


async def test_a_run_taken_over_max_recoveries_times_in_a_row_is_parked_dead(
    settings: Settings, store: Store
) -> None:
    limited = settings.model_copy(update={"max_recoveries": 2})
    async with extra_stores(limited, 1) as (thieves,):
        row = await _stale(store, await make_running(thieves, "r1"))
        for thief, expected in ((OWNER_B, 1), (OWNER_C, 2)):
            outcome = await thieves.runs.steal("r1", row.snapshot, thief, PROBE, stale_after_ms=0)
            assert isinstance(outcome, Stolen), outcome
            assert outcome.row.recoveries == expected
            row = await _stale(store, outcome.row)
        buried = await thieves.runs.steal("r1", row.snapshot, OWNER_A, PROBE, stale_after_ms=0)
    assert isinstance(buried, DeadLettered), buried
    assert buried.previous == OWNER_C
    dead = buried.row
    assert dead.status is RunStatus.SUSPENDED and dead.owner is None and dead.epoch == 3
    assert dead.waiting is not None and dead.waiting.reason is WaitingReason.DEAD
    assert dead.waiting.wake_at_ms is None and dead.recoveries == 2
    evidence = dead.waiting.request
    assert evidence["lost_owners"] == [OWNER_C.key, OWNER_B.key, OWNER_A.key], evidence
    assert evidence["recoveries"] == evidence["max_recoveries"] == 2
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "dead-lettered"
    assert record.payload["previous_owner"] == OWNER_C.key
    assert record.payload["observer"] == OWNER_A.key
    assert record.payload["lost_owners"] == evidence["lost_owners"]
    # The lost owner stays fenced, and nothing takes the run: not a claim, not a wake.
    fenced = await store.lifecycle.transition_owned("r1", OWNER_C, 3, RunStatus.COMPLETED)
    assert isinstance(fenced, NotOwner)
    refused = await store.runs.claim_and_activate("r1", dead.snapshot, OWNER_B)
    assert isinstance(refused, SnapshotChanged)

    revived = await store.runs.revive("r1", note="ops")
    assert revived is not None and revived.recoveries == 0 and revived.waiting is None
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "resumed"
    assert record.payload["from"] == "dead" and record.payload["recoveries"] == 2
    assert record.payload["evidence"] == evidence and record.payload["note"] == "ops"
    assert record.payload["actor"]  # the authenticated role
    assert await store.runs.revive("r1") is None  # not dead any more: nothing changes
    again = await activate(store, "r1", OWNER_B)
    assert again.epoch == 4 and again.recoveries == 0


async def test_a_lost_execution_that_recorded_progress_starts_the_count_again(
    settings: Settings, store: Store
) -> None:
    """Losses are "in a row" only while the run records nothing new: an execution that
    recorded a step before its process was lost is the first of a new row, so a healthy
    run in a fleet whose workers keep dying is never taken for poison; one that records
    nothing between losses still is."""
    limited = settings.model_copy(update={"max_recoveries": 1})
    async with extra_stores(limited, 1) as (thieves,):
        row = await _stale(store, await make_running(thieves, "r1"))
        stolen = await thieves.runs.steal("r1", row.snapshot, OWNER_B, PROBE, stale_after_ms=0)
        assert isinstance(stolen, Stolen) and stolen.row.recoveries == 1
        for position, owner, thief in ((0, OWNER_B, OWNER_C), (1, OWNER_C, OWNER_A)):
            write = StepWrite(
                "r1", stolen.row.epoch, f"step:s{position}#1", "s", "step", position, 1
            )
            (recorded,) = await thieves.steps.record_many(owner, [write])
            assert recorded is not None
            row = await _stale(store, stolen.row)
            stolen = await thieves.runs.steal("r1", row.snapshot, thief, PROBE, stale_after_ms=0)
            # At the limit already, but the lost execution progressed: taken over, and
            # its loss is the first of a new row.
            assert isinstance(stolen, Stolen), stolen
            assert stolen.row.recoveries == 1
        # A record of an earlier execution is no progress of this one: this loss counts.
        row = await _stale(store, stolen.row)
        dead = await thieves.runs.steal("r1", row.snapshot, OWNER_B, PROBE, stale_after_ms=0)
    assert isinstance(dead, DeadLettered), dead
    assert dead.evidence["recoveries"] == 1, dead.evidence


async def test_a_clean_end_of_an_execution_starts_the_count_again(
    settings: Settings, store: Store
) -> None:
    limited = settings.model_copy(update={"max_recoveries": 1})
    async with extra_stores(limited, 1) as (thieves,):
        row = await _stale(store, await make_running(thieves, "r1"))
        stolen = await thieves.runs.steal("r1", row.snapshot, OWNER_B, PROBE, stale_after_ms=0)
        assert isinstance(stolen, Stolen) and stolen.row.recoveries == 1
        parked = await thieves.waits.park("r1", OWNER_B, 2, Waiting(reason=WaitingReason.EVENT))
        assert isinstance(parked, Parked)
        assert (await must_get(thieves, "r1")).recoveries == 0
        assert isinstance(await thieves.waits.wake("r1"), Woken)
        row = await _stale(store, await activate(thieves, "r1", OWNER_C))
        stolen = await thieves.runs.steal("r1", row.snapshot, OWNER_A, PROBE, stale_after_ms=0)
        assert isinstance(stolen, Stolen) and stolen.row.recoveries == 1
        # Taking back a run this process orphaned is no lost process: it never counts.
        row = await _stale(store, stolen.row)
        orphaned = jr.ProbeEvidence(probe="self-orphaned", observer=OWNER_A.key)
        back = await thieves.runs.steal(
            "r1", row.snapshot, OWNER_A, orphaned, stale_after_ms=0, counted=False
        )
        assert isinstance(back, Stolen) and back.row.recoveries == 1
        row = await _stale(store, back.row)
        dead = await thieves.runs.steal("r1", row.snapshot, OWNER_B, PROBE, stale_after_ms=0)
    assert isinstance(dead, DeadLettered)
    assert dead.evidence["lost_owners"] == [OWNER_A.key, OWNER_C.key], dead.evidence
