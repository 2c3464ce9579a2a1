"""The decisions a sweep tick takes, as store methods (``Sweeps.locked``, ``advance_locked``,
``each_row``): the sweeper opens no transaction of its own (STYLE rule 13)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from runfleet.store import Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.sweeps import (
    CursorAdvance,
    LockHeld,
    RowFailed,
    RowWritten,
    SweepKey,
    Swept,
)
from tests.store.helpers import create, extra_stores, must_get

KIND = SweepKind.DUE_CLOCKS


async def test_a_tick_runs_under_the_kinds_lock_or_says_it_is_held(
    store: Store, settings: Settings
) -> None:
    async def sweep() -> str:
        return "found"

    assert await store.sweeps.locked(KIND, sweep) == Swept("found")
    async with extra_stores(settings, 1) as (other,):
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with other.transaction():
                assert await other.sweeps.try_lock(KIND)
                holding.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.wait_for(holding.wait(), 10)
        try:
            assert await store.sweeps.locked(KIND, sweep) == LockHeld()
            before = await store.sweeps.cursor(KIND)
            later = before.at(SweepKey(5, "r"))
            assert await store.sweeps.advance_locked(KIND, before, later) is (
                CursorAdvance.LOCK_HELD
            )
            assert await store.sweeps.locked(SweepKind.PARKED, sweep) == Swept("found"), (
                "another kind's lock is its own"
            )
        finally:
            release.set()
            await holder
    before = await store.sweeps.cursor(KIND)
    later = before.at(SweepKey(5, "r"))
    assert await store.sweeps.advance_locked(KIND, before, later) is CursorAdvance.ADVANCED
    assert (await store.sweeps.cursor(KIND)).after == SweepKey(5, "r")
    assert await store.sweeps.advance_locked(KIND, before, later) is CursorAdvance.MOVED


async def test_a_row_that_raises_rolls_back_alone_and_the_tick_goes_on(store: Store) -> None:
    await create(store, "kept")
    await create(store, "dropped")

    async def good() -> None:
        await store.lifecycle.request_cancel("kept")

    async def bad() -> None:
        await store.lifecycle.request_cancel("dropped")  # rolled back with the failure below
        raise psycopg.errors.DataError("a row Postgres refused")

    async def sweep() -> list[object]:
        return [await store.sweeps.each_row(bad), await store.sweeps.each_row(good)]

    ticked = await store.sweeps.locked(KIND, sweep)
    assert isinstance(ticked, Swept)
    failed, written = ticked.found
    assert isinstance(failed, RowFailed) and isinstance(failed.error, psycopg.errors.DataError)
    assert written == RowWritten()
    assert (await must_get(store, "kept")).cancel_requested_at_ms is not None
    dropped = await must_get(store, "dropped")
    assert dropped.cancel_requested_at_ms is None, "the failed row's write was rolled back"
    assert "cancel-requested" not in [r.kind for r in await store.journal.records("dropped")]


@pytest.mark.parametrize("kind", [SweepKind.LOST_PENDING])
async def test_a_tick_that_raises_releases_the_lock(store: Store, kind: SweepKind) -> None:
    async def broken() -> None:
        raise RuntimeError("the sweep failed")

    with pytest.raises(RuntimeError):
        await store.sweeps.locked(kind, broken)

    async def sweep() -> int:
        return 1

    assert await store.sweeps.locked(kind, sweep) == Swept(1)
