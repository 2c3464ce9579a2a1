"""Real worker processes: exactly one run per tick while a worker is SIGKILLed, missed-tick
policies across a fleet stop, and the overlap policy with runs that outlast their period."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import signal
import time

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.schedules import Overlap, Schedules
from runfleet.store.types import RunStatus
from runfleet.worker import process
from tests.fleet.procs import Spawn
from tests.schedules.helpers import (
    TickRun,
    assert_one_run_per_tick,
    every_second,
    gap,
    tick_runs,
)
from tests.support.polling import until


@pytest.fixture(autouse=True)
def _scheduler_wired() -> None:
    """Say plainly why every test here would time out on a worker that runs no scheduler."""
    source = inspect.getsource(process)
    if "Scheduler(" not in source or "register_schedules(" not in source:
        pytest.fail(
            "worker/process.py does not run runfleet.worker.scheduler: add Scheduler(...).run(stop) "
            "beside the sweeper and register_schedules(...) after the flow registry"
        )


FLEET_SECONDS = 20.0
"""The issue asks for ~30 s; 20 s on this shared 2-core machine (kill at the middle)."""


async def _settled(settings: Settings, name: str, timeout: float) -> list[TickRun]:
    async def check() -> list[TickRun] | None:
        runs = await tick_runs(settings.database_url, name)
        return runs if runs and all(RunStatus(r.status).terminal for r in runs) else None

    return await until(check, timeout, f"every run of {name} to settle")


async def test_three_workers_one_sigkilled_admit_exactly_one_run_per_tick(
    spawn: Spawn, settings: Settings, store: Store
) -> None:
    workers = [spawn(flows="tests.schedules.scheduled", concurrency=4) for _ in range(3)]
    for w in workers:
        await w.wait_started()
    schedules = Schedules.of(store)
    name = "sched.every_second"
    row = await schedules.get(name)
    assert row is not None and row.spec.origin.value == "decorator"
    assert row.spec.cron.timezone == "Europe/Paris"
    await asyncio.sleep(FLEET_SECONDS / 2)
    victim = workers[0]
    victim.signal(signal.SIGKILL)
    killed_at_ms = int(time.time() * 1000)
    await victim.wait_exit()
    await asyncio.sleep(FLEET_SECONDS / 2)
    await schedules.pause(name)  # admissions stop here; then every run must settle
    runs = await _settled(settings, name, timeout=30)
    assert len(runs) >= FLEET_SECONDS - 4, [r.id for r in runs]
    assert_one_run_per_tick(runs)
    assert {r.status for r in runs} == {"completed"}
    row = await schedules.get(name)
    assert row is not None and row.missed == 0 and row.admitted == len(runs)
    # No leader: more than one worker admitted ticks, and ticks after the kill were
    # admitted by the survivors (the victim's owner key is its pid's).
    admitters = {r.admitted_by for r in runs}
    per_worker = sorted(sum(r.admitted_by == a for r in runs) for a in admitters)
    print(f"schedule fleet: {len(runs)} ticks, one run each, admissions per worker {per_worker}")
    assert len(admitters) >= 2, admitters
    after = [r for r in runs if r.created_at_ms > killed_at_ms + 500]
    assert after and all(f":{victim.pid}:" not in r.admitted_by for r in after)


async def test_missed_ticks_while_no_worker_ran_skip_or_catch_up(
    spawn: Spawn, settings: Settings, store: Store
) -> None:
    first = spawn(flows="tests.schedules.flows")
    await first.wait_started()
    schedules = Schedules.of(store)  # added once a scheduler runs: no tick missed before
    await schedules.add(every_second("skip", "sched.noop", catch_up=0))
    await schedules.add(every_second("catch", "sched.noop", catch_up=3))

    async def admitted(name: str, at_least: int) -> bool:
        return len(await tick_runs(settings.database_url, name)) >= at_least

    await until(lambda: admitted("skip", 3), 20, "ticks before the stop")
    first.signal(signal.SIGTERM)
    assert await first.wait_exit() == 0
    stopped = len(await tick_runs(settings.database_url, "catch"))
    await asyncio.sleep(6)  # six ticks with no worker at all
    second = spawn(flows="tests.schedules.flows")
    await second.wait_started()
    await until(lambda: admitted("catch", stopped + 6), 20, "ticks after the restart")
    await schedules.pause("skip")
    await schedules.pause("catch")
    skip, catch = await _settled(settings, "skip", 20), await _settled(settings, "catch", 20)
    grace = settings.schedule_grace_ms
    for runs in (skip, catch):  # on-time runs were admitted within the grace of their tick
        assert all(r.created_at_ms - r.tick_ms <= grace + 500 for r in runs if not r.late)
    skip_row, catch_row = await schedules.get("skip"), await schedules.get("catch")
    assert skip_row is not None and catch_row is not None
    # skip: no late admission at all; the gap is exactly the ticks counted missed.
    assert [r.late for r in skip].count(False) == len(skip)
    assert skip_row.missed >= 3
    assert gap(skip) == skip_row.missed
    # catch_up=3: exactly the 3 most recent missed ticks were admitted late.
    late = [r for r in catch if r.late]
    assert len(late) == 3 and all(r.created_at_ms - r.tick_ms > grace for r in late)
    assert catch_row.missed == gap(catch) and catch_row.missed >= 1
    after_late = [r.tick_ms for r in catch if r.tick_ms >= late[0].tick_ms]
    assert after_late == list(range(after_late[0], after_late[-1] + 1, 1000))


async def test_overlap_skip_never_runs_two_at_once_and_allow_does(
    spawn: Spawn, settings: Settings, store: Store
) -> None:
    schedules = Schedules.of(store)
    slow = "sched.slow"
    await schedules.add(every_second("skip", slow, overlap=Overlap.SKIP))
    await schedules.add(every_second("allow", slow, overlap=Overlap.ALLOW))
    workers = [spawn(flows="tests.schedules.flows", concurrency=8) for _ in range(2)]
    for w in workers:
        await w.wait_started()

    async def enough() -> bool:
        return len(await tick_runs(settings.database_url, "skip")) >= 3

    await until(enough, 30, "three runs of the overlap=skip schedule")
    await schedules.pause("skip")
    await schedules.pause("allow")
    skip = await _settled(settings, "skip", 20)
    allow = await _settled(settings, "allow", 20)
    for before, after in itertools.pairwise(skip):
        assert after.created_at_ms >= before.updated_at_ms, "admitted while the previous ran"
    row = await schedules.get("skip")
    assert row is not None and row.overlapped >= 2 * (len(skip) - 1)
    assert_one_run_per_tick(allow)
    assert any(b.created_at_ms < a.updated_at_ms for a, b in itertools.pairwise(allow))
