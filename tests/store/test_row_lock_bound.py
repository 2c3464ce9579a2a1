"""A worker's store bounds every lock wait (``Store.open(lock_timeout_ms=...)``; a worker
passes ``Settings.worker_lock_wait_ms``).

A write on one run whose row another transaction holds past the bound answers
``RowLocked`` and writes nothing (a producer may hold its own run's row ``FOR UPDATE``:
tests/security/test_row_lock_bound.py has the fleet's side). Within the bound two
claimants still wait for each other, so the lock-gate races keep their answers
(tests/store/test_claims.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

from runfleet.store import Store, settlements
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.types import Activated, RowLocked, RunStatus, SnapshotChanged
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    create,
    journal_kinds,
    make_running,
    must_get,
    race,
    row_lock_gate,
)
from tests.store.test_claims import CLAIMANTS, PROBE

BOUND_MS = 200


@asynccontextmanager
async def bounded(settings: Settings, lock_ms: int, n: int = 1) -> AsyncIterator[list[Store]]:
    """``n`` stores whose every lock wait ends after ``lock_ms``, as a worker's do."""
    stores: list[Store] = []
    try:
        for _ in range(n):
            stores.append(
                await Store.open(settings, min_size=1, max_size=2, lock_timeout_ms=lock_ms)
            )
        yield stores
    finally:
        for opened in stores:
            await opened.close()


async def test_each_write_on_one_run_gives_up_on_a_held_row(
    settings: Settings, store: Store, database_url: str
) -> None:
    """The one-run claim, the snapshot claim, a steal, a lone settlement and a release, each
    against a row another transaction holds: RowLocked after about the bound, the row and
    its journal as they were."""
    fresh = await create(store, "fresh")
    mine = await make_running(store, "mine", OWNER_A)
    async with bounded(settings, BOUND_MS) as (worker,):

        async def claim_if_fresh() -> object:
            claim = await worker.runs.claim_if_fresh("fresh", fresh.flow, OWNER_B)
            assert claim.seen is not None and claim.seen.id == "fresh"  # read without a lock
            return claim.outcome

        attempts: dict[str, Callable[[], Awaitable[object]]] = {
            "claim_if_fresh": claim_if_fresh,
            "claim_and_activate": partial(
                worker.runs.claim_and_activate, "fresh", fresh.snapshot, OWNER_B
            ),
            "steal": partial(
                worker.runs.steal, "mine", mine.snapshot, OWNER_B, PROBE, stale_after_ms=0
            ),
            "settle": partial(
                worker.lifecycle.settle, OWNER_A, settlements.completed("mine", mine.epoch, 1)
            ),
            "release": partial(
                worker.waits.release,
                "mine",
                OWNER_A,
                mine.epoch,
                jr.ReleaseCause.INTERRUPTED,
                "shutdown",
            ),
        }
        for name, attempt in attempts.items():
            run_id = "fresh" if name.startswith("claim") else "mine"
            async with row_lock_gate(database_url, run_id):
                began = time.monotonic()
                outcome = await attempt()
                waited = time.monotonic() - began
            assert isinstance(outcome, RowLocked), (name, outcome)
            assert outcome.current.id == run_id, name
            assert BOUND_MS / 1000 * 0.9 <= waited < 5.0, (name, waited)
    assert (await must_get(store, "fresh")).status is RunStatus.PENDING
    assert await journal_kinds(store, "fresh") == ["created"]
    after = await must_get(store, "mine")
    assert (after.status, after.owner, after.epoch) == (RunStatus.RUNNING, OWNER_A, 1)
    assert await journal_kinds(store, "mine") == ["created", "claimed-and-activated"]


async def test_claimants_still_wait_for_each_other_within_the_bound(
    settings: Settings, store: Store, database_url: str
) -> None:
    """Eight bounded claimants queue behind a row the gate holds until all of them wait,
    well within their bound: exactly one activates, every other one reads the winner's
    change (SnapshotChanged), none gives up (RowLocked)."""
    async with bounded(settings, 10_000, len(CLAIMANTS)) as stores:
        for i in range(10):
            run_id = f"bounded-race-{i}"
            snapshot = (await create(store, run_id)).snapshot
            outcomes = await race(
                [
                    partial(s.runs.claim_and_activate, run_id, snapshot, me)
                    for s, me in zip(stores, CLAIMANTS, strict=True)
                ],
                gate=row_lock_gate(database_url, run_id),
            )
            winners = [o for o in outcomes if isinstance(o, Activated)]
            assert len(winners) == 1, outcomes
            assert all(isinstance(o, SnapshotChanged) for o in outcomes if o not in winners)
            assert await journal_kinds(store, run_id) == ["created", "claimed-and-activated"]
