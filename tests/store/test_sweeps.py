"""Sweep reads (bounded, oldest first, cursor-based) and the per-kind sweep lock."""

from __future__ import annotations

from runfleet.store import Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.types import (
    Activated,
    Claimed,
    PendingCursor,
    RunStatus,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    OWNER_C,
    activate,
    create,
    extra_stores,
    make_parked,
    make_running,
    must_get,
    wait_db_time_past,
)

# ---- stale running -----------------------------------------------------------


async def test_stale_running_lists_expired_leases_oldest_first(store: Store) -> None:
    beats: dict[str, int] = {}
    for run_id, owner in (("s1", OWNER_A), ("s2", OWNER_B), ("s3", OWNER_C)):
        row = await make_running(store, run_id, owner)
        assert row.heartbeat_at_ms is not None
        beats[run_id] = row.heartbeat_at_ms
        await wait_db_time_past(store, row.heartbeat_at_ms)
    await make_parked(store, "parked", Waiting(WaitingReason.EVENT))
    await create(store, "pending")

    stale = await store.sweeps.stale_running(0)
    assert [(s.id, s.owner, s.heartbeat_at_ms) for s in stale] == [
        ("s1", OWNER_A, beats["s1"]),
        ("s2", OWNER_B, beats["s2"]),
        ("s3", OWNER_C, beats["s3"]),
    ]
    assert [s.id for s in await store.sweeps.stale_running(0, limit=2)] == ["s1", "s2"]
    assert await store.sweeps.stale_running(3_600_000) == []

    renewed = await store.runs.heartbeat(OWNER_A, ["s1"])
    await wait_db_time_past(store, renewed.now_ms)
    assert [s.id for s in await store.sweeps.stale_running(0)] == ["s2", "s3", "s1"]
    await store.lifecycle.transition_owned("s2", OWNER_B, 1, RunStatus.COMPLETED)
    assert [s.id for s in await store.sweeps.stale_running(0)] == ["s3", "s1"]


# ---- pending runs ------------------------------------------------------------


async def _pending_population(store: Store) -> list[str]:
    """Eligible pending runs in sweep order; plus ineligible rows the sweep must skip."""
    for run_id in ("pc", "pa", "pb", "pd"):
        await create(store, run_id, flow="f.main")
    await create(store, "pz", flow="f.other")
    await create(store, "delayed", flow="f.main", delay_until_ms=10**15)
    claimed = await create(store, "claimed", flow="f.main")
    assert isinstance(await store.runs.claim("claimed", claimed.snapshot, OWNER_A), Claimed)
    await make_running(store, "running", flow="f.main")
    rows = [await must_get(store, r) for r in ("pc", "pa", "pb", "pd", "pz")]
    await wait_db_time_past(store, max(r.created_at_ms for r in rows))
    return [r.id for r in sorted(rows, key=lambda r: (r.created_at_ms, r.id))]


async def test_pending_runs_oldest_first_with_cursors(store: Store) -> None:
    order = await _pending_population(store)
    everything = await store.sweeps.pending_runs()
    assert [c.run_id for c in everything] == order
    assert all(isinstance(c, PendingCursor) and c.created_at_ms > 0 for c in everything)

    first_two = await store.sweeps.pending_runs(limit=2)
    assert first_two == everything[:2]
    rest = await store.sweeps.pending_runs(after=first_two[-1])
    assert rest == everything[2:]
    bounded = await store.sweeps.pending_runs(after=everything[0], through=everything[2])
    assert bounded == everything[1:3]
    assert await store.sweeps.pending_runs(after=everything[-1]) == []


async def test_pending_runs_filters_by_flow_and_age(store: Store) -> None:
    order = await _pending_population(store)
    main = await store.sweeps.pending_runs(flow="f.main")
    assert [c.run_id for c in main] == [r for r in order if r != "pz"]
    assert [c.run_id for c in await store.sweeps.pending_runs(flow="f.other")] == ["pz"]
    assert await store.sweeps.pending_runs(older_than_ms=3_600_000) == []
    newest = max([await must_get(store, r) for r in order], key=lambda r: r.created_at_ms)
    await wait_db_time_past(store, newest.created_at_ms + 30)
    assert [c.run_id for c in await store.sweeps.pending_runs(older_than_ms=20)] == order


async def test_pending_tail_is_the_newest_eligible(store: Store) -> None:
    assert await store.sweeps.pending_tail() is None
    order = await _pending_population(store)
    everything = await store.sweeps.pending_runs()
    assert await store.sweeps.pending_tail() == everything[-1]
    main_tail = await store.sweeps.pending_tail(flow="f.main")
    assert main_tail is not None
    assert main_tail.run_id == [r for r in order if r != "pz"][-1]
    assert await store.sweeps.pending_tail(older_than_ms=3_600_000) is None
    # A scan bounded by the tail is finite even while new admissions arrive.
    tail = await store.sweeps.pending_tail()
    await create(store, "newcomer")
    newest = await must_get(store, "newcomer")
    await wait_db_time_past(store, newest.created_at_ms)
    assert await store.sweeps.pending_runs(through=tail) == everything


# ---- pending cancellations ---------------------------------------------------


async def test_pending_cancellations_lists_unowned_runs_with_a_request(store: Store) -> None:
    for run_id in ("c-pending-1", "c-pending-2", "calm"):
        await create(store, run_id)
    await make_parked(store, "c-parked", Waiting(WaitingReason.EVENT))
    await make_running(store, "c-running")
    await make_running(store, "c-done")
    await store.lifecycle.transition_owned("c-done", OWNER_A, 1, RunStatus.COMPLETED)
    for run_id in ("c-pending-1", "c-pending-2", "c-parked", "c-running", "c-done"):
        await store.lifecycle.request_cancel(run_id)
    rows = [await must_get(store, r) for r in ("c-pending-1", "c-pending-2", "c-parked")]
    expected = [
        PendingCursor(r.id, r.created_at_ms)
        for r in sorted(rows, key=lambda r: (r.created_at_ms, r.id))
    ]
    assert await store.sweeps.pending_cancellations() == expected
    assert await store.sweeps.pending_cancellations(limit=1) == expected[:1]
    assert await store.sweeps.pending_cancellations(after=expected[0]) == expected[1:]
    assert await store.sweeps.pending_cancellations(after=expected[-1]) == []


# ---- stranded claims ---------------------------------------------------------


async def test_stranded_claims_lists_claims_older_than_the_limit(store: Store) -> None:
    ats: list[tuple[str, int]] = []
    for run_id, claimant in (("k1", OWNER_A), ("k2", OWNER_B)):
        row = await create(store, run_id)
        claimed = await store.runs.claim(run_id, row.snapshot, claimant)
        assert isinstance(claimed, Claimed) and claimed.row.claimed_at_ms is not None
        ats.append((run_id, claimed.row.claimed_at_ms))
        await wait_db_time_past(store, claimed.row.claimed_at_ms)
    await make_running(store, "active")

    stranded = await store.sweeps.stranded_claims(0)
    assert stranded == [("k1", OWNER_A, ats[0][1]), ("k2", OWNER_B, ats[1][1])]
    assert await store.sweeps.stranded_claims(0, limit=1) == stranded[:1]
    assert await store.sweeps.stranded_claims(3_600_000) == []
    claimed_at = ats[1][1]
    activated = await store.runs.activate("k2", OWNER_B, claimed_at)
    assert isinstance(activated, Activated)
    assert [s[0] for s in await store.sweeps.stranded_claims(0)] == ["k1"]
    assert await store.runs.abandon_claim("k1", OWNER_A)
    assert await store.sweeps.stranded_claims(0) == []
    assert (await activate(store, "k1", OWNER_C)).owner == OWNER_C


# ---- the sweep lock ----------------------------------------------------------


async def test_try_lock_holds_for_the_transaction(settings: Settings, store: Store) -> None:
    async with extra_stores(settings, 1) as (other,):
        async with store.transaction():
            assert await store.sweeps.try_lock(SweepKind.STALE_RUNNING) is True
            assert await store.sweeps.try_lock(SweepKind.STALE_RUNNING) is True, "re-entrant"
            assert await other.sweeps.try_lock(SweepKind.STALE_RUNNING) is False
            assert await other.sweeps.try_lock(SweepKind.DUE_CLOCKS) is True, "per kind"
            async with other.transaction():
                assert await other.sweeps.try_lock(SweepKind.STALE_RUNNING) is False
        assert await other.sweeps.try_lock(SweepKind.STALE_RUNNING) is True
        async with other.transaction():
            assert await other.sweeps.try_lock(SweepKind.PARKED) is True
            assert await store.sweeps.try_lock(SweepKind.PARKED) is False
        assert await store.sweeps.try_lock(SweepKind.PARKED) is True


async def test_try_lock_is_released_when_the_transaction_rolls_back(
    settings: Settings, store: Store
) -> None:
    class Boom(Exception):
        pass

    async with extra_stores(settings, 1) as (other,):
        try:
            async with store.transaction():
                assert await store.sweeps.try_lock(SweepKind.LOST_PENDING) is True
                assert await other.sweeps.try_lock(SweepKind.LOST_PENDING) is False
                raise Boom
        except Boom:
            pass
        assert await other.sweeps.try_lock(SweepKind.LOST_PENDING) is True


# ---- runnable suspended ------------------------------------------------------


async def test_runnable_suspended_lists_woken_runs_nobody_resumed(store: Store) -> None:
    await make_parked(store, "woken-1", Waiting(WaitingReason.EVENT))
    await make_parked(store, "woken-2", Waiting(WaitingReason.EVENT))
    await make_parked(store, "still-waiting", Waiting(WaitingReason.EVENT))
    await make_parked(store, "claimed", Waiting(WaitingReason.EVENT))
    for run_id in ("woken-1", "woken-2", "claimed"):
        await store.waits.wake(run_id)
    claimed = await must_get(store, "claimed")
    assert isinstance(await store.runs.claim("claimed", claimed.snapshot, OWNER_B), Claimed)
    rows = [await must_get(store, r) for r in ("woken-1", "woken-2", "claimed")]
    await wait_db_time_past(store, max(r.updated_at_ms for r in rows))
    expected = [r.id for r in sorted(rows[:2], key=lambda r: (r.updated_at_ms, r.id))]

    async def listed(older_than_ms: int, limit: int = 64) -> list[str]:
        found = await store.sweeps.runnable_suspended(older_than_ms=older_than_ms, limit=limit)
        return [k.run_id for k in found]

    assert await listed(0) == expected
    assert await listed(0, limit=1) == expected[:1]
    assert await listed(3_600_000) == []
    await activate(store, "woken-1", OWNER_C)
    assert await listed(0) == ["woken-2"]
