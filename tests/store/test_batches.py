"""Batched claims and settlements keep every per-run rule of their one-run forms.

``claim_and_activate_many`` and ``settle_many`` are the worker's hot path under load:
each row keeps its own snapshot check or fence, its own cancel guard and its own
record, and two batches (or a batch and the owner's own renewal) never deadlock. The
races are made to happen: separate connections, opposite orders, many rounds.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.steps import StepWrite
from runfleet.store.types import (
    Activated,
    GuardFailed,
    NotFound,
    NotOwner,
    RowLocked,
    RunStatus,
    Settle,
    SnapshotChanged,
    Transitioned,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    activate,
    create,
    journal_kinds,
    make_running,
    must_get,
)


async def test_a_batch_claim_activates_each_fresh_run_with_its_own_record(store: Store) -> None:
    rows = [await create(store, f"r{i}") for i in range(5)]
    lost = await activate(store, "r3", OWNER_B)  # another worker got r3 first
    outcomes = await store.runs.claim_and_activate_many(rows, OWNER_A)
    for row in rows:
        outcome = outcomes[row.id]
        if row.id == "r3":
            assert isinstance(outcome, SnapshotChanged) and outcome.current.owner == OWNER_B
            assert outcome.current.epoch == lost.epoch
            continue
        assert isinstance(outcome, Activated), outcome
        assert outcome.row.owner == OWNER_A and outcome.row.epoch == 1
        assert outcome.row.status is RunStatus.RUNNING
        assert (await journal_kinds(store, row.id)).count("claimed-and-activated") == 1


async def test_a_batch_claim_takes_only_fresh_admissions(store: Store) -> None:
    running = await make_running(store, "r1")
    with pytest.raises(InvalidInput, match="r1"):
        await store.runs.claim_and_activate_many([running], OWNER_B)
    assert (await must_get(store, "r1")).owner == OWNER_A, "nothing written"


async def test_overlapping_batches_on_two_connections_activate_each_run_once(
    store: Store, settings: Settings
) -> None:
    """Redelivered entries hand two workers the same runs in different orders: each run
    is activated exactly once, and neither batch deadlocks nor waits: the loser skipped
    a row the winner held (``RowLocked``) or read the winner's change."""
    other = await Store.open(settings)
    try:
        for round_no in range(20):
            rows = [await create(store, f"o{round_no}-{i}") for i in range(8)]
            mine, theirs = list(rows), list(reversed(rows))
            random.shuffle(mine)
            a, b = await asyncio.gather(
                store.runs.claim_and_activate_many(mine, OWNER_A),
                other.runs.claim_and_activate_many(theirs, OWNER_B),
            )
            for row in rows:
                won = [o for o in (a[row.id], b[row.id]) if isinstance(o, Activated)]
                assert len(won) == 1, (row.id, a[row.id], b[row.id])
                lost = b[row.id] if isinstance(a[row.id], Activated) else a[row.id]
                assert isinstance(lost, SnapshotChanged | RowLocked), lost
                if isinstance(lost, SnapshotChanged):
                    assert lost.current.owner == won[0].row.owner
    finally:
        await other.close()


async def test_a_batch_settlement_answers_each_run_its_own_outcome(store: Store) -> None:
    done = await make_running(store, "done")
    guarded = await make_running(store, "guarded")
    await store.lifecycle.request_cancel("guarded")
    theirs = await make_running(store, "theirs", OWNER_B)
    stale = await make_running(store, "stale")
    parent = await make_running(store, "parent")
    child = await create(store, "child", parent_id="parent")
    waiter = await make_running(store, "waiter")
    await create(store, "awaited", parent_id="waiter")
    awaited = await activate(store, "awaited")
    await store.waits.park(
        "waiter",
        OWNER_A,
        waiter.epoch,
        Waiting(WaitingReason.CHILD, token="awaited"),
        deferred="child:awaited",
    )
    items = [
        Settle("done", done.epoch, RunStatus.COMPLETED, {"result": 1.5}),
        Settle("guarded", guarded.epoch, RunStatus.COMPLETED, {"result": 2}),
        Settle("theirs", theirs.epoch, RunStatus.COMPLETED, {"result": 3}),
        Settle("stale", stale.epoch + 1, RunStatus.FAILED, {"error": {"type": "X"}}),
        Settle("parent", parent.epoch, RunStatus.FAILED, {"error": {"type": "Boom"}}),
        Settle("awaited", awaited.epoch, RunStatus.COMPLETED, {"result": [4]}),
        Settle("nobody", 1, RunStatus.COMPLETED, {"result": None}),
    ]
    outcomes = await store.lifecycle.settle_many(OWNER_A, items)
    by_id = dict(zip([i.run_id for i in items], outcomes, strict=True))

    first = by_id["done"]
    assert isinstance(first, Transitioned) and first.row.status is RunStatus.COMPLETED
    assert first.row.state["result"] == 1.5
    assert isinstance(by_id["guarded"], GuardFailed), "a cancel that landed first wins"
    assert (await must_get(store, "guarded")).status is RunStatus.RUNNING
    assert isinstance(by_id["theirs"], NotOwner) and isinstance(by_id["stale"], NotOwner)
    assert (await must_get(store, "theirs")).status is RunStatus.RUNNING
    assert isinstance(by_id["nobody"], NotFound)
    ended = by_id["parent"]
    assert isinstance(ended, Transitioned) and ended.cascaded == (child.id,)
    assert (await must_get(store, child.id)).cancel_requested_at_ms is not None
    woke = by_id["awaited"]
    assert isinstance(woke, Transitioned) and [r.id for r in woke.woke] == ["waiter"]
    assert woke.woke[0].waiting is None, "the woken row as the waking statement left it"
    assert (await must_get(store, "waiter")).waiting is None
    for run_id in ("done", "parent", "awaited"):
        assert (await journal_kinds(store, run_id)).count("transitioned") == 1
    for run_id in ("guarded", "theirs", "stale"):
        assert "transitioned" not in await journal_kinds(store, run_id)


async def test_a_batch_settlement_refuses_a_run_twice_or_a_non_terminal_status(
    store: Store,
) -> None:
    row = await make_running(store, "r1")
    twice = [Settle("r1", row.epoch, RunStatus.COMPLETED, {}) for _ in range(2)]
    with pytest.raises(InvalidInput):
        await store.lifecycle.settle_many(OWNER_A, twice)
    with pytest.raises(InvalidInput):
        await store.lifecycle.settle_many(
            OWNER_A, [Settle("r1", row.epoch, RunStatus.SUSPENDED, {})]
        )
    assert (await must_get(store, "r1")).status is RunStatus.RUNNING, "nothing written"


async def test_a_settlement_batch_and_the_owners_renewal_never_deadlock(
    store: Store, settings: Settings
) -> None:
    """The renewal (own pool) locks every owned row while a batch settles some of them:
    neither ever waits on the other (both skip locked rows): a row the renewal held is
    left out of the batch (``RowLocked``) and settles alone; a row the batch held is
    skipped by the renewal, never reported lost."""
    lease = await Store.open(settings)
    try:
        for round_no in range(15):
            rows = [await make_running(store, f"h{round_no}-{i}") for i in range(12)]
            settling = random.sample(rows, 6)
            ids = [r.id for r in rows]
            random.shuffle(ids)
            renewed, settled = await asyncio.gather(
                lease.runs.heartbeat(OWNER_A, ids),
                store.lifecycle.settle_many(
                    OWNER_A,
                    [Settle(r.id, r.epoch, RunStatus.COMPLETED, {"result": 0}) for r in settling],
                ),
            )
            for item, outcome in zip(settling, settled, strict=True):
                if isinstance(outcome, RowLocked):
                    outcome = await store.lifecycle.settle(
                        OWNER_A, Settle(item.id, item.epoch, RunStatus.COMPLETED, {"result": 0})
                    )
                assert isinstance(outcome, Transitioned), outcome
            untouched = {r.id for r in rows} - {r.id for r in settling}
            assert untouched <= renewed.confirmed, "every run still running is renewed"
            assert renewed.skipped <= {r.id for r in settling}, "only rows the batch held"
    finally:
        await lease.close()


async def test_batched_step_writes_keep_each_runs_fence(store: Store) -> None:
    mine = await make_running(store, "s-mine")
    other = await make_running(store, "s-other")
    taken = await make_running(store, "s-taken", OWNER_B)
    starts = await store.steps.start_attempts(
        OWNER_A,
        [
            (mine.id, mine.epoch, "step:a#1"),
            (other.id, other.epoch, "step:a#1"),
            (taken.id, taken.epoch, "step:a#1"),
        ],
    )
    assert starts == [1, 1, None], "a run another owner holds starts nothing"
    again = await store.steps.start_attempts(OWNER_A, [(mine.id, mine.epoch, "step:a#1")])
    assert again == [2], "the counter carries on per (run, step)"
    writes = [
        StepWrite(mine.id, mine.epoch, "step:a#1", "a", "step", 0, {"x": 1.0}, attempt=2),
        StepWrite(other.id, other.epoch + 1, "step:a#1", "a", "step", 0, 2, attempt=1),
        StepWrite(taken.id, taken.epoch, "step:a#1", "a", "step", 0, 3, attempt=1),
    ]
    recorded = await store.steps.record_many(OWNER_A, writes)
    assert recorded[0] is not None and recorded[0].output == {"x": 1.0} and recorded[0].intact
    assert recorded[1] is None, "a stale epoch records nothing"
    assert recorded[2] is None, "another owner's run records nothing"
    assert (await journal_kinds(store, mine.id)).count("step-recorded") == 1
    assert "step-recorded" not in await journal_kinds(store, other.id)
    attempts = await store.steps.attempts(mine.id, "step:a#1")
    assert [a["finished_at_ms"] is not None for a in attempts] == [False, True]
