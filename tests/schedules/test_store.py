"""Firing schedules against real Postgres: racing schedulers, policies, pause/resume, upserts."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import psycopg

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.schedules import Fired, NotDue, Overlap, Schedules
from tests.schedules.helpers import assert_one_run_per_tick, every_second, gap, tick_runs
from tests.support.polling import until


async def _fire_for(seconds: float, *fires: Schedules, name: str) -> list[Fired | NotDue]:
    """Fire ``name`` from every store at the same instant, again and again."""
    outcomes: list[Fired | NotDue] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        outcomes += await asyncio.gather(*(s.fire(name, grace_ms=2000) for s in fires))
        await asyncio.sleep(0.05)
    return outcomes


async def test_two_schedulers_racing_admit_each_tick_exactly_once(
    store: Store, settings: Settings
) -> None:
    other = await Store.open(settings)
    try:
        mine, theirs = Schedules.of(store), Schedules.of(other)
        assert await mine.add(every_second("race")) is not None
        outcomes = await _fire_for(4.0, mine, theirs, name="race")
    finally:
        await other.close()
    runs = await tick_runs(settings.database_url, "race")
    assert len(runs) >= 3
    assert_one_run_per_tick(runs)
    admitted = [row.id for o in outcomes if isinstance(o, Fired) for row in o.admitted]
    assert sorted(admitted) == sorted(r.id for r in runs)  # each run admitted by one firing
    # The race happened: both fired at once while due, and the loser found nothing to do.
    assert any(isinstance(o, NotDue) for o in outcomes)
    assert all(o.joined == 0 for o in outcomes if isinstance(o, Fired))
    row = await mine.get("race")
    assert row is not None and row.missed == 0 and row.admitted == len(runs)


async def test_overlap_skip_admits_no_tick_while_the_previous_run_is_open(
    store: Store, settings: Settings
) -> None:
    schedules = Schedules.of(store)
    await schedules.add(every_second("skip", overlap=Overlap.SKIP))
    await schedules.add(every_second("allow", overlap=Overlap.ALLOW))
    await asyncio.gather(
        _fire_for(3.5, schedules, name="skip"), _fire_for(3.5, schedules, name="allow")
    )
    skipped = await tick_runs(settings.database_url, "skip")
    allowed = await tick_runs(settings.database_url, "allow")
    assert len(skipped) == 1 and skipped[0].status == "pending"  # no worker: it stays open
    row = await schedules.get("skip")
    assert row is not None and row.overlapped >= 2 and row.admitted == 1
    assert len(allowed) >= 3
    assert_one_run_per_tick(allowed)


async def test_missed_ticks_skip_or_catch_up(store: Store, settings: Settings) -> None:
    """No scheduler for ~4.5 ticks, then one pass: skip admits only on-time ticks (the
    latest among them), catch_up=3 also the 3 most recent missed ones."""
    schedules = Schedules.of(store)
    await schedules.add(every_second("skip", catch_up=0))
    await schedules.add(every_second("catch", catch_up=3))

    async def fired(name: str) -> bool:
        return isinstance(await schedules.fire(name, grace_ms=1000), Fired)

    for name in ("skip", "catch"):  # each fired on time once: nothing missed before
        await until(partial(fired, name), 5, f"the first tick of {name}")
    await asyncio.sleep(4.5)  # nobody fires: ticks fall due and age past the grace
    skip = await schedules.fire("skip", grace_ms=1000)
    catch = await schedules.fire("catch", grace_ms=1000)
    assert isinstance(skip, Fired) and isinstance(catch, Fired)
    skip_runs = await tick_runs(settings.database_url, "skip")
    catch_runs = await tick_runs(settings.database_url, "catch")
    # skip: no late admission; the ticks with no run are exactly those counted missed.
    assert [r.late for r in skip_runs].count(True) == 0
    assert skip.missed >= 2 and gap(skip_runs) == skip.missed
    # catch_up=3: the 3 most recent missed ticks admitted (late), in a row, then on time.
    assert [r.late for r in catch_runs].count(True) == 3
    assert gap(catch_runs) == catch.missed
    late = [r.tick_ms for r in catch_runs if r.late]
    assert late == list(range(late[0], late[0] + 3000, 1000))
    on_time = [r for r in catch_runs if not r.late and r.tick_ms > late[-1]]
    assert on_time and on_time[0].tick_ms == late[-1] + 1000  # nothing between them missed


async def test_pause_stops_ticks_and_resume_starts_after_now(store: Store) -> None:
    schedules = Schedules.of(store)
    await schedules.add(every_second("p"))
    paused = await schedules.pause("p")
    assert paused is not None and paused.paused
    await asyncio.sleep(2.2)
    assert isinstance(await schedules.fire("p", grace_ms=2000), NotDue)
    resumed = await schedules.resume("p")
    assert resumed is not None and not resumed.paused
    assert resumed.next_tick_ms > resumed.now_ms  # the ticks while paused never come
    assert resumed.missed == 0
    assert await schedules.resume("nope") is None and await schedules.pause("nope") is None
    assert await schedules.remove("p") and not await schedules.remove("p")


async def test_upsert_keeps_the_cadence_and_restarts_it_on_a_new_cron(store: Store) -> None:
    schedules = Schedules.of(store)
    spec = every_second("u")
    first = await schedules.upsert(spec)
    assert first is not None
    assert await schedules.upsert(spec) is None  # unchanged: nothing written
    await schedules.pause("u")
    moved = await schedules.upsert(every_second("u", queue="other"))
    assert moved is not None and moved.next_tick_ms == first.next_tick_ms
    assert moved.paused  # an operator's pause survives a worker's restart
    assert await schedules.add(spec) is None  # the CLI's add never overwrites


async def test_a_scheduler_holding_the_row_delays_nobody_and_its_death_loses_no_tick(
    store: Store, settings: Settings
) -> None:
    """A scheduler stuck mid-fire (its transaction open, holding the row) is skipped, not
    waited for; when it dies its transaction rolls back and the next firing admits every
    tick that fell due meanwhile, once each."""
    schedules = Schedules.of(store)
    await schedules.add(every_second("held"))
    async with await psycopg.AsyncConnection.connect(settings.database_url) as stuck:
        await stuck.execute("SELECT * FROM runfleet.schedules WHERE name = 'held' FOR UPDATE")
        await asyncio.sleep(1.5)  # a tick falls due under the lock
        started = time.monotonic()
        assert isinstance(await schedules.fire("held", grace_ms=3000), NotDue)
        assert time.monotonic() - started < 0.5  # skipped, not waited for
    # The connection closed without a commit: the dead scheduler's firing never happened.
    fired = await schedules.fire("held", grace_ms=3000)
    assert isinstance(fired, Fired) and fired.admitted and fired.missed == 0
    runs = await tick_runs(settings.database_url, "held")
    assert_one_run_per_tick(runs)
    assert [r.id for r in runs] == [r.id for r in fired.admitted]
