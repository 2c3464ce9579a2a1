"""A settlement with nothing to hand over is one autocommitted statement (migration 0027).

``Lifecycle.settle_many`` first tries ``runs.settle_alone``: the batch's settlements,
records and clocks, then, after the row locks were won, whether any run has a parent
edge on its lineage or an open attached descendant. If so the statement undoes its
settlement (a savepoint inside it: no error) and answers ``refused``, and the batch is
settled again in a transaction with the walk and the hand-over. These tests check which
way each batch goes (the statements it ran, by name), that the refused attempt leaves
nothing behind, and that a parent joining while the settlement is in flight is handed
the outcome (the race made to happen: the joiner holds the row, the batch leaves the run
out, RowLocked, migration 0028, and the run settled alone waits for its row).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    Owner,
    Parked,
    RowLocked,
    RunRow,
    RunStatus,
    Settle,
    Transitioned,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    activate,
    create,
    extra_stores,
    journal_kinds,
    make_running,
    must_get,
)


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The names of the statements ``store`` runs through ``Database.all``, in order."""
    names: list[str] = []
    db = store.db
    original = db.all

    async def spy(name: str, params: dict[str, Any] | None = None) -> Any:
        names.append(name)
        return await original(name, params)

    db.all = spy  # type: ignore[method-assign]  # a spy on this one instance
    try:
        yield names
    finally:
        del db.all


def _done(run_id: str, epoch: int, value: object = 1) -> Settle:
    return Settle(run_id, epoch, RunStatus.COMPLETED, {"result": value})


async def _parked_on(store: Store, waiter: RunRow, child_id: str) -> None:
    """``waiter`` (running) parks on its child ``child_id``'s outcome."""
    assert waiter.owner is not None
    parked = await store.waits.park(
        waiter.id, waiter.owner, waiter.epoch, Waiting(WaitingReason.CHILD, token=child_id),
        deferred=f"child:{child_id}",
    )  # fmt: skip
    assert isinstance(parked, Parked), parked


async def _settled_the_long_way(store: Store, run: RunRow, owner: Owner, *, woke: str) -> None:
    """``run`` settles: refused alone, then the long way, which wakes ``woke`` once."""
    with statements(store) as ran:
        (outcome,) = await store.lifecycle.settle_many(owner, [_done(run.id, run.epoch)])
    assert ran[:2] == ["runs.settle_alone", "runs.settle_many"], ran
    assert isinstance(outcome, Transitioned) and [r.id for r in outcome.woke] == [woke]
    assert (await must_get(store, woke)).waiting is None
    assert (await journal_kinds(store, run.id)).count("transitioned") == 1


async def test_a_batch_with_nothing_to_hand_over_is_one_statement(store: Store) -> None:
    plain = [await make_running(store, f"plain{i}") for i in range(3)]
    # A parent whose only child already settled: an edge, but nothing open to cancel.
    parent = await make_running(store, "parent")
    await create(store, "kid", parent_id="parent")
    kid = await activate(store, "kid", OWNER_B)
    (kid_done,) = await store.lifecycle.settle_many(OWNER_B, [_done("kid", kid.epoch)])
    assert isinstance(kid_done, Transitioned)
    items = [_done(r.id, r.epoch, i) for i, r in enumerate([*plain, parent])]
    with statements(store) as ran:
        outcomes = await store.lifecycle.settle_many(OWNER_A, items)
    assert ran == ["runs.settle_alone"]
    for item, outcome in zip(items, outcomes, strict=True):
        assert isinstance(outcome, Transitioned), outcome
        assert outcome.cascaded == () and outcome.woke == ()
        row = await must_get(store, item.run_id)
        assert row.status is RunStatus.COMPLETED and row.result == item.patch["result"]
        assert row.owner is None
        assert (await journal_kinds(store, item.run_id)).count("transitioned") == 1


async def test_a_child_goes_the_long_way_and_wakes_its_parent(store: Store) -> None:
    waiter = await make_running(store, "waiter")
    await create(store, "child", parent_id="waiter")
    child = await activate(store, "child", OWNER_B)
    await _parked_on(store, waiter, "child")
    # Refused before anything was written (the child's state names its parent).
    await _settled_the_long_way(store, child, OWNER_B, woke="waiter")
    assert await store.deferreds.deferred("waiter", "child:child") is not None


async def test_a_refused_attempt_leaves_nothing_before_the_long_way(store: Store) -> None:
    """A run adopted by a parent after its admission (its state names none) is refused
    only after its settlement: the undone attempt leaves no record and no settled
    row behind, and the long way hands the outcome over once."""
    shared = await make_running(store, "shared")
    joiner = await make_running(store, "joiner", OWNER_B)
    await store.dag.record_parent("shared", "joiner")
    await _parked_on(store, joiner, "shared")
    await _settled_the_long_way(store, shared, OWNER_A, woke="joiner")


async def test_a_parent_with_an_open_child_goes_the_long_way_and_cascades(store: Store) -> None:
    parent = await make_running(store, "parent")
    await create(store, "open-kid", parent_id="parent")
    await create(store, "done-kid", parent_id="parent")
    kid = await activate(store, "done-kid", OWNER_B)
    await store.lifecycle.settle_many(OWNER_B, [_done("done-kid", kid.epoch)])
    with statements(store) as ran:
        (outcome,) = await store.lifecycle.settle_many(OWNER_A, [_done("parent", parent.epoch)])
    assert ran[:2] == ["runs.settle_alone", "runs.settle_many"], ran
    assert isinstance(outcome, Transitioned) and outcome.cascaded == ("open-kid",)
    assert (await must_get(store, "open-kid")).cancel_requested_at_ms is not None
    assert (await journal_kinds(store, "parent")).count("transitioned") == 1


async def test_a_parent_kept_out_of_the_first_question_still_sends_the_batch_the_long_way(
    store: Store,
) -> None:
    """The question after the settlement, not the one before it, decides: a batch whose
    runs name no parent but one of whose rounds has a parent edge is refused after its
    settlement (the early probe reads only the state)."""
    target = await make_running(store, "r1")
    await make_running(store, "p", OWNER_B)
    await store.dag.record_parent("r1", "p")
    with statements(store) as ran:
        (outcome,) = await store.lifecycle.settle_many(OWNER_A, [_done("r1", target.epoch)])
    assert ran[:2] == ["runs.settle_alone", "runs.settle_many"], ran
    assert isinstance(outcome, Transitioned)
    assert await store.deferreds.deferred("p", "child:r1") is not None


@pytest.mark.parametrize("round_no", range(3))
async def test_a_parent_joining_while_the_settlement_waits_is_handed_the_outcome(
    store: Store, settings: Settings, round_no: int
) -> None:
    """The joiner records its edge and locks the run's row (``deliver_settled``: the run
    is still running, so nothing is delivered) and holds its transaction open. The batch
    settlement does not wait on that row (migration 0028, SKIP LOCKED): it writes nothing
    and answers ``RowLocked``. The run is then settled alone, as the worker does
    (worker/settle.py), and that settlement waits on the joiner's lock. When the joiner
    commits, the settlement's statements after its row lock see the edge: the joiner gets
    its ``child:`` deferred. Skipped and not settled again, or asked in a snapshot taken
    before the joiner committed, nobody would hand the outcome over."""
    child = await make_running(store, "solo")
    await make_running(store, "late", OWNER_B)
    item = _done("solo", child.epoch)
    async with extra_stores(settings, 1) as (joiner,):
        async with joiner.db.transaction():
            await joiner.dag.record_parent("solo", "late")
            assert await joiner.dag.deliver_settled("solo", "late") == []
            # The batch never waits on the held row: it leaves the run out, unwritten.
            (left_out,) = await asyncio.wait_for(store.lifecycle.settle_many(OWNER_A, [item]), 10)
            assert isinstance(left_out, RowLocked), left_out
            assert left_out.current.status is RunStatus.RUNNING
            assert "transitioned" not in await journal_kinds(store, "solo")
            # Settled alone, the run waits for its own row, held by the joiner.
            settling = asyncio.create_task(store.lifecycle.settle(OWNER_A, item))
            await _until_waiting_on_a_lock(joiner)
            assert not settling.done()
        outcome = await asyncio.wait_for(settling, 10)
    assert isinstance(outcome, Transitioned), outcome
    assert outcome.row.status is RunStatus.COMPLETED
    handed = await store.deferreds.deferred("late", "child:solo")
    assert handed is not None, "the joiner was never handed the outcome"
    assert (await journal_kinds(store, "solo")).count("transitioned") == 1


async def _until_waiting_on_a_lock(store: Store, timeout: float = 10.0) -> None:
    """Until some backend of this database waits on a lock (the settlement's UPDATE)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with store.db.pool.connection() as conn:
        while True:
            cursor = await conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            if row is not None and row["n"] > 0:
                return
            if loop.time() > deadline:
                raise AssertionError("the settlement never waited on the joiner's lock")
            await asyncio.sleep(0.02)


async def test_inside_a_callers_transaction_a_refused_attempt_leaves_it_usable(
    store: Store,
) -> None:
    """The attempt undoes itself (a savepoint inside the statement, no error), so a
    transaction the caller holds open goes on, and the long way runs in it."""
    await make_running(store, "waiter")
    await create(store, "child", parent_id="waiter")
    child = await activate(store, "child", OWNER_B)
    async with store.db.transaction():
        with statements(store) as ran:
            (outcome,) = await store.lifecycle.settle_many(OWNER_B, [_done("child", child.epoch)])
        assert await store.runs.get("waiter") is not None  # the transaction is still usable
    assert ran[:2] == ["runs.settle_alone", "runs.settle_many"], ran
    assert isinstance(outcome, Transitioned)
    assert await store.deferreds.deferred("waiter", "child:child") is not None
