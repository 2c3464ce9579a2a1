"""Cancellation: request (first writer wins), cascade, acknowledgement, and its races."""

from __future__ import annotations

from functools import partial

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    AlreadyRequested,
    AlreadyTerminal,
    CancelRequested,
    Created,
    GuardFailed,
    NewRun,
    NotFound,
    NotOwner,
    OnParentExit,
    RunStatus,
    Transitioned,
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
    journal_kinds,
    make_parked,
    make_running,
    must_get,
    race_pair,
    row_lock_gate,
)

ITERATIONS = 50


async def test_first_request_wins_and_later_ones_are_already_requested(store: Store) -> None:
    await create(store, "r1")
    first = await store.lifecycle.request_cancel("r1", note="alice", reason="typo")
    assert isinstance(first, CancelRequested)
    at = first.row.cancel_requested_at_ms
    assert at is not None and first.row.status is RunStatus.PENDING
    second = await store.lifecycle.request_cancel("r1", note="bob")
    assert isinstance(second, AlreadyRequested)
    assert second.row.cancel_requested_at_ms == at
    records = [r for r in await store.journal.records("r1") if r.kind == "cancel-requested"]
    assert len(records) == 1
    # who asked is the authenticated role; the caller's "alice" is only a note
    assert records[0].payload == {
        "actor": "postgres",
        "note": "alice",
        "reason": "typo",
        "status": "pending",
    }


async def test_request_on_a_settled_run_is_already_terminal(store: Store) -> None:
    await make_running(store, "r1")
    await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    outcome = await store.lifecycle.request_cancel("r1")
    assert isinstance(outcome, AlreadyTerminal)
    assert outcome.row.status is RunStatus.COMPLETED
    assert outcome.row.cancel_requested_at_ms is None
    assert "cancel-requested" not in await journal_kinds(store, "r1")


async def test_request_on_an_unknown_run_is_not_found(store: Store) -> None:
    assert await store.lifecycle.request_cancel("ghost") == NotFound("ghost")


async def test_request_leaves_a_running_run_to_its_owner(store: Store) -> None:
    await make_running(store, "r1")
    outcome = await store.lifecycle.request_cancel("r1")
    assert isinstance(outcome, CancelRequested)
    row = await must_get(store, "r1")
    assert row.status is RunStatus.RUNNING and row.owner == OWNER_A
    assert (await store.runs.heartbeat(OWNER_A, ["r1"])).cancel_requested == {"r1"}


async def test_request_on_a_parked_run_leaves_it_for_the_sweeps(store: Store) -> None:
    await make_parked(store, "r1", Waiting(WaitingReason.EVENT))
    await make_parked(store, "calm", Waiting(WaitingReason.EVENT))
    assert isinstance(await store.lifecycle.request_cancel("r1"), CancelRequested)
    row = await must_get(store, "r1")
    assert row.status is RunStatus.SUSPENDED and row.waiting is not None
    listed = await store.waits.waiting_runs(cancel_requested=True)
    assert [w.run_id for w in listed] == ["r1"]
    assert [c.run_id for c in await store.sweeps.pending_cancellations()] == ["r1"]


async def test_acknowledge_cancel_closes_the_run_cancelled(store: Store) -> None:
    await make_running(store, "r1")
    await store.waits.schedule_clock("r1", "nap", "nap-done", 10**15, OWNER_A, 1)
    await store.lifecycle.request_cancel("r1")
    outcome = await store.lifecycle.acknowledge_cancel("r1", OWNER_A, 1, found_at="shutdown")
    assert isinstance(outcome, Transitioned)
    row = outcome.row
    assert row.status is RunStatus.CANCELLED and row.owner is None
    assert row.state["cancellation"] == {
        "acknowledged_by": OWNER_A.key,
        "found_at_release": "shutdown",
    }
    assert await store.waits.pending_clocks("r1") == []
    record = (await store.journal.last("r1", limit=1))[0]
    assert record.kind == "interrupted"
    assert record.payload == {
        "to": "cancelled",
        "epoch": 1,
        "cancelled": True,
        "found_at_release": "shutdown",
    }
    assert isinstance(await store.lifecycle.request_cancel("r1"), AlreadyTerminal)


async def test_acknowledge_cancel_is_owner_fenced(store: Store) -> None:
    await make_running(store, "r1")
    await store.lifecycle.request_cancel("r1")
    assert isinstance(await store.lifecycle.acknowledge_cancel("r1", OWNER_B, 1), NotOwner)
    assert isinstance(await store.lifecycle.acknowledge_cancel("r1", OWNER_A, 0), NotOwner)
    assert await store.lifecycle.acknowledge_cancel("ghost", OWNER_A, 1) == NotFound("ghost")
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING


async def test_cancel_cascades_through_every_attached_level(store: Store) -> None:
    # root -> a (pending) -> b (parked) -> c (running, owner C) -> d (pending)
    # root -> det (detached, pending) -> det-child (attached to det, pending)
    await create(store, "root")
    await create(store, "a", parent_id="root")
    await make_parked(
        store, "b", Waiting(WaitingReason.TIMER, wake_at_ms=10**15), OWNER_B, parent_id="a"
    )
    await store.waits.schedule_clock("b", "t", "t-done", 10**15, OWNER_B, 1)
    await create(store, "c", parent_id="b")
    await activate(store, "c", OWNER_C)
    await create(store, "d", parent_id="c")
    await create(store, "det", parent_id="root", on_parent_exit=OnParentExit.DETACH)
    await create(store, "det-child", parent_id="det")

    outcome = await store.lifecycle.request_cancel("root", note="ops")
    assert isinstance(outcome, CancelRequested)

    root = await must_get(store, "root")
    assert root.status is RunStatus.PENDING and root.cancel_requested_at_ms is not None
    # The cascade only asks: each descendant closes through its own cancel path
    # (claimed, its compensations run, then cancelled), never in SQL behind its back.
    for asked in ("a", "b", "d"):
        row = await must_get(store, asked)
        assert row.status is not RunStatus.CANCELLED, asked
        assert row.cancel_requested_at_ms is not None, asked
        record = (await store.journal.last(asked, limit=1))[0]
        assert record.kind == "cancel-requested"
        assert record.payload == {"actor": "postgres", "cause": "parent-cancelled", "by": "root"}
    assert (await must_get(store, "b")).waiting is not None, "the cancel sweep wakes it"
    c = await must_get(store, "c")
    assert c.status is RunStatus.RUNNING and c.owner == OWNER_C
    assert c.cancel_requested_at_ms is not None
    for untouched in ("det", "det-child"):
        row = await must_get(store, untouched)
        assert row.status is RunStatus.PENDING and row.cancel_requested_at_ms is None

    policy = (await store.journal.last("root", limit=1))[0]
    assert policy.kind == "child-policy-applied"
    assert sorted(policy.payload["cascaded_to"]) == ["a", "b", "c", "d"]
    # The running descendant is closed by its owner, which sees the request.
    assert (await store.runs.heartbeat(OWNER_C, ["c"])).cancel_requested == {"c"}
    assert isinstance(await store.lifecycle.acknowledge_cancel("c", OWNER_C, 1), Transitioned)


async def test_cascade_skips_children_already_settled(store: Store) -> None:
    await create(store, "root")
    await make_running(store, "done", parent_id="root")
    await store.lifecycle.transition_owned("done", OWNER_A, 1, RunStatus.COMPLETED)
    await create(store, "live", parent_id="root")
    await store.lifecycle.request_cancel("root")
    assert (await must_get(store, "done")).status is RunStatus.COMPLETED
    assert (await must_get(store, "done")).cancel_requested_at_ms is None
    assert (await must_get(store, "live")).cancel_requested_at_ms is not None


async def test_request_cancel_of_a_child_leaves_its_parent_alone(store: Store) -> None:
    await create(store, "root")
    await create(store, "child", parent_id="root")
    await store.lifecycle.request_cancel("child")
    assert (await must_get(store, "root")).cancel_requested_at_ms is None


# ---- races -------------------------------------------------------------------


async def test_race_settlement_against_cancel_request_never_both(
    settings: Settings, store: Store, database_url: str
) -> None:
    seen: set[str] = set()
    async with extra_stores(settings, 2) as (settler, canceller):
        for i in range(ITERATIONS):
            run_id = f"race-{i}"
            await make_running(store, run_id)

            settled, cancelled = await race_pair(
                partial(
                    settler.lifecycle.transition_owned, run_id, OWNER_A, 1, RunStatus.COMPLETED
                ),
                partial(canceller.lifecycle.request_cancel, run_id),
                second_starts_first=i % 2 == 1,
                gate=row_lock_gate(database_url, run_id) if i % 4 < 2 else None,
            )

            row = await must_get(store, run_id)
            if isinstance(settled, Transitioned):
                assert isinstance(cancelled, AlreadyTerminal), (settled, cancelled)
                assert row.status is RunStatus.COMPLETED
                assert row.cancel_requested_at_ms is None
                seen.add("settled")
            else:
                assert isinstance(settled, GuardFailed), settled
                assert isinstance(cancelled, CancelRequested), cancelled
                assert row.status is RunStatus.RUNNING
                assert row.cancel_requested_at_ms is not None
                closed = await store.lifecycle.acknowledge_cancel(run_id, OWNER_A, 1)
                assert isinstance(closed, Transitioned)
                assert closed.row.status is RunStatus.CANCELLED
                seen.add("cancelled")
            kinds = await journal_kinds(store, run_id)
            assert ("cancel-requested" in kinds) != ("transitioned" in kinds), kinds
    assert seen == {"settled", "cancelled"}, "both orders must have been exercised"


async def test_race_child_admission_against_parent_cancel_never_orphans(
    settings: Settings, store: Store, database_url: str
) -> None:
    """Whichever commits first, the attached child ends up cancelled or asked to cancel."""
    async with extra_stores(settings, 2) as (admitter, canceller):
        for i in range(ITERATIONS):
            parent_id, child_id = f"parent-{i}", f"child-{i}"
            await make_running(store, parent_id)

            admitted, cancelled = await race_pair(
                partial(
                    admitter.admission.create, NewRun(id=child_id, flow="f", parent_id=parent_id)
                ),
                partial(canceller.lifecycle.request_cancel, parent_id),
                second_starts_first=i % 2 == 1,
                gate=row_lock_gate(database_url, parent_id) if i % 4 < 2 else None,
            )
            assert isinstance(admitted, Created), admitted
            assert isinstance(cancelled, CancelRequested), cancelled

            child = await must_get(store, child_id)
            assert child.cancel_requested_at_ms is not None, child
            assert child.status is RunStatus.PENDING  # its own cancel path closes it
            created = (await store.journal.records(child_id))[0]
            if not created.payload["inherited_cancel"]:  # admitted first, asked by the cascade
                assert "cancel-requested" in await journal_kinds(store, child_id)
