"""Sweep cursors live in Postgres: whichever worker wins a tick continues the walk.

Two sweepers with their own pools stand for two worker processes that win alternate
ticks. With 7 released runs and a batch of 3, every run is dispatched within
ceil(7 / 3) = 3 ticks in total, and the walk wraps around to the start; a cursor kept
in each process would have the second one start over at the first row.
"""

from __future__ import annotations

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Waiting, WaitingReason
from runfleet.worker.sweeper import Sweeper
from tests.store.helpers import extra_stores, make_parked


async def test_sweepers_of_two_processes_share_one_cursor_and_wrap(
    store: Store, settings: Settings
) -> None:
    released = [f"rel-{i}" for i in range(7)]
    for run_id in released:
        await make_parked(store, run_id, Waiting(WaitingReason.RELEASED))
    small = settings.model_copy(update={"sweep_batch": 3})
    dispatched: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        assert reason == "sweep:parked", (reason, run_ids)  # no other sweep has rows here
        dispatched.append(sorted(run_ids))
        return set(run_ids)

    async with extra_stores(settings, 2) as (one, two):
        a, b = Sweeper(one, small, dispatch), Sweeper(two, small, dispatch)
        for sweeper in (a, b, a):
            await sweeper.tick()
        assert [len(batch) for batch in dispatched] == [3, 3, 3]
        assert sorted({r for batch in dispatched for r in batch}) == released
        # The third tick reached the end after one row and wrapped: the batch is full
        # and the cursor now points past the start, where the next tick continues.
        assert dispatched[2] == sorted(["rel-6", "rel-0", "rel-1"])
        await b.tick()
        assert dispatched[3] == ["rel-2", "rel-3", "rel-4"]


async def test_a_failed_dispatch_leaves_its_batch_to_the_next_tick(
    store: Store, settings: Settings
) -> None:
    """The cursor moves after the dispatch, only past what it dispatched: a dispatch that
    fails (Redis refused the wakes and no local drive could take them) is tried again next
    tick, not skipped for a whole cycle."""
    released = [f"rel-{i}" for i in range(7)]
    for run_id in released:
        await make_parked(store, run_id, Waiting(WaitingReason.RELEASED))
    small = settings.model_copy(update={"sweep_batch": 3})
    offered: list[list[str]] = []
    failing = [True]

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        offered.append(list(run_ids))
        if failing[0]:
            failing[0] = False
            raise ConnectionError("no route to Redis")
        return set(run_ids)

    sweeper = Sweeper(store, small, dispatch)
    await sweeper.tick()
    await sweeper.tick()
    assert offered == [released[0:3], released[0:3]]  # the same batch again, not rel-3..5
    await sweeper.tick()
    assert offered[2] == released[3:6]


async def test_a_partial_dispatch_moves_the_cursor_past_the_dispatched_prefix_only(
    store: Store, settings: Settings
) -> None:
    released = [f"rel-{i}" for i in range(7)]
    for run_id in released:
        await make_parked(store, run_id, Waiting(WaitingReason.RELEASED))
    small = settings.model_copy(update={"sweep_batch": 3})
    offered: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        offered.append(list(run_ids))
        # The first tick: the second row finds no place (Redis down, its queue not served
        # here), the first and third do; the cursor stops after the first.
        return {run_ids[0], run_ids[2]} if len(offered) == 1 else set(run_ids)

    sweeper = Sweeper(store, small, dispatch)
    await sweeper.tick()
    await sweeper.tick()
    assert offered == [released[0:3], released[1:4]]  # from the first row not dispatched
