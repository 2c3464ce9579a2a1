"""Seed rules the sweeps keep: one kind failing never stops the others.

Real Postgres, the production ``Sweeper``; the failures are injected into one kind's read
at a time (the statement raising as a broken query or a lost connection would), and the
dispatch records what each tick handed on.
"""

from __future__ import annotations

import psycopg
import pytest

from runfleet.store import Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.types import Waiting, WaitingReason
from runfleet.worker.sweeper import Sweeper
from tests.store.helpers import create, make_parked, must_get


async def test_a_failing_sweep_kind_never_stops_the_others(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first kind of a tick (stale running) and one in the middle (due waits) raise;
    the tick still ends normally, the kinds between and after them do their work in the
    same tick (a released run is dispatched, a run past its deadline is asked to cancel),
    and a failed kind's cursor stays where it was, so the next tick tries it again."""
    await make_parked(store, "released", Waiting(WaitingReason.RELEASED))
    await create(store, "overdue", deadline_ms=1)
    dispatched: list[tuple[str, list[str]]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        dispatched.append((reason, sorted(run_ids)))
        return set(run_ids)

    async def broken(*_args: object, **_kwargs: object) -> list[object]:
        raise psycopg.errors.DataError("the kind's read failed")

    stale_before = await store.sweeps.cursor(SweepKind.STALE_RUNNING)
    waits_before = await store.sweeps.cursor(SweepKind.DUE_WAITS)
    monkeypatch.setattr(store.sweeps, "stale_running", broken)
    monkeypatch.setattr(store.sweeps, "due_waits", broken)
    sweeper = Sweeper(store, settings, dispatch)
    await sweeper.tick()  # raises nothing: each failure is logged and counted

    assert ("sweep:parked", ["released"]) in dispatched, dispatched
    overdue = await must_get(store, "overdue")
    assert overdue.cancel_requested_at_ms is not None, "the deadline kind ran after a failure"
    assert ("sweep:deadline_passed", ["overdue"]) in dispatched, dispatched
    assert (await store.sweeps.cursor(SweepKind.STALE_RUNNING)).after == stale_before.after
    assert (await store.sweeps.cursor(SweepKind.DUE_WAITS)).after == waits_before.after
