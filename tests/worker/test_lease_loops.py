"""The lease's three loops against the real store: none waits on another (DESIGN §5)."""

from __future__ import annotations

import asyncio
import time

from store import Store
from store.config import Settings
from store.types import Owner
from worker.driver import Driver
from worker.lease import Lease, LeaseGate
from worker.watchdog import Watchdog


async def _run_lease(lease: Lease, seconds: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(lease.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_hung_liveness_write_never_delays_renewals(settings: Settings, store: Store) -> None:
    """Redis hanging (a silent drop) must not stop renewals: the gate stays open."""
    owner = Owner.for_this_process(settings.host_id)
    hung = asyncio.Event()

    async def refresh(_confirmed: int, _lapsed: bool, _runs: int) -> None:
        await hung.wait()  # never answers, like a Redis behind a dropped link

    lease = Lease(store, Driver(store, owner, settings), owner, settings, refresh_liveness=refresh)
    gate_closed = 0

    async def watch_gate() -> None:
        nonlocal gate_closed
        while True:
            await asyncio.sleep(settings.heartbeat_interval / 4)
            if lease.gate.confirmed_sent is not None and not lease.gate.open():
                gate_closed += 1

    watcher = asyncio.create_task(watch_gate())
    await _run_lease(lease, settings.stale_after * 3)
    watcher.cancel()
    assert not lease.lapsed
    assert gate_closed == 0
    assert lease.gate.confirmed_sent is not None
    assert time.monotonic() - lease.gate.confirmed_sent < settings.lapse_after


async def test_gate_closes_on_its_own_timer_while_a_renewal_hangs(
    settings: Settings, store: Store
) -> None:
    """A renewal that never answers: the lapse comes from the clock, not from the renewal."""
    owner = Owner.for_this_process(settings.host_id)
    lease = Lease(store, Driver(store, owner, settings), owner, settings)
    assert await lease.tick() is not None
    sent = lease.gate.confirmed_sent
    assert sent is not None and lease.gate.open()
    never = asyncio.Event()

    async def hang(*_args: object) -> None:
        await never.wait()

    store.runs.heartbeat = hang  # type: ignore[assignment,method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(lease.run(stop))
    deadline = time.monotonic() + settings.stale_after * 2
    while not lease.lapsed and time.monotonic() < deadline:  # noqa: ASYNC110 - polls a plain flag
        await asyncio.sleep(0.01)
    lapsed_after = time.monotonic() - sent
    stop.set()
    await asyncio.wait_for(task, 5)
    assert lease.lapsed
    assert settings.lapse_after <= lapsed_after < settings.lapse_after + 0.2
    assert not lease.gate.open()


def test_gate_is_closed_before_the_first_confirmation(settings: Settings) -> None:
    gate = LeaseGate(settings)
    assert not gate.open() and not gate.expired()
    gate.confirm(time.monotonic())
    assert gate.open()
    gate.confirm(time.monotonic() - 100)  # an older confirmation never moves it back
    assert gate.open()


def test_watchdog_fires_when_a_run_keeps_executing_past_the_failstop() -> None:
    fired: list[int] = []
    sent = time.monotonic()
    dog = Watchdog(
        confirmed_sent=lambda: sent,
        executing=lambda: 1,
        failstop_after=0.2,
        confirm=0.05,
        exit=fired.append,
    )
    dog.start()
    deadline = time.monotonic() + 2
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    dog.stop()
    assert fired == [75]
    assert 0.25 <= time.monotonic() - sent < 1.0


def test_watchdog_spares_a_process_whose_runs_stop_within_the_confirm_window() -> None:
    """Thawed after SIGSTOP, overdue at once, but the runs stop in time: no exit."""
    fired: list[int] = []
    executing = [1]
    dog = Watchdog(
        confirmed_sent=lambda: time.monotonic() - 10,  # long overdue from the first poll
        executing=lambda: executing[0],
        failstop_after=0.2,
        confirm=0.3,
        exit=fired.append,
    )
    dog.start()
    time.sleep(0.1)
    executing[0] = 0  # the lapse loop interrupted the run
    time.sleep(0.5)
    dog.stop()
    dog.stop()  # twice is harmless
    assert fired == []
