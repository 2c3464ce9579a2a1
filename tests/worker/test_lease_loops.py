"""The lease's three loops against the real store: none waits on another (DESIGN §5)."""

from __future__ import annotations

import asyncio
import time

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from runfleet.worker.driver import Driver
from runfleet.worker.lease import Lease, LeaseGate, LeaseSignals
from runfleet.worker.watchdog import Watchdog, WatchdogSignals


async def test_hung_liveness_write_never_delays_renewals(settings: Settings, store: Store) -> None:
    """Redis hanging (a silent drop) must not stop renewals: the gate stays open."""
    owner = Owner.for_this_process(settings.host_id)
    hung = asyncio.Event()

    async def refresh(_confirmed: int, _lapsed: bool, _runs: int) -> None:
        await hung.wait()  # never answers, like a Redis behind a dropped link

    signals = LeaseSignals()
    lease = Lease(
        store,
        Driver(store, owner, settings),
        owner,
        settings,
        refresh_liveness=refresh,
        signals=signals,
    )
    lease.start()
    try:
        assert await signals.published.wait() is False  # the write hung and timed out
        began = time.monotonic()
        while time.monotonic() - began < settings.stale_after * 3:
            # Each renewal confirmed within the lapse margin of the one before.
            assert await signals.renewed.wait(settings.lapse_after) is not None
        assert lease.gate.open()
    finally:
        lease.stop()
        assert await lease.wait_stopped(5)
    assert signals.lapsed.count == 0
    assert not lease.lapsed
    assert signals.published.count >= 2  # the liveness loop kept trying, on its own timer


async def test_gate_closes_on_its_own_timer_while_a_renewal_hangs(
    settings: Settings, store: Store
) -> None:
    """A renewal that never answers: the lapse comes from the clock, not from the renewal."""
    owner = Owner.for_this_process(settings.host_id)
    signals = LeaseSignals()
    lease = Lease(store, Driver(store, owner, settings), owner, settings, signals=signals)
    assert await lease.tick() is not None
    sent = lease.gate.confirmed_sent
    assert sent is not None and lease.gate.open()
    never = asyncio.Event()

    async def hang(*_args: object) -> None:
        await never.wait()

    store.runs.heartbeat = hang  # type: ignore[assignment,method-assign]  # a hanging stand-in for the renewal statement
    lease.start()
    try:
        await signals.lapsed.wait(settings.stale_after * 2)
        lapsed_after = time.monotonic() - sent
        assert lease.lapsed
        assert settings.lapse_after <= lapsed_after < settings.lapse_after + 0.2
        assert not lease.gate.open()

        # The database answers again: the next confirmed renewal reopens the gate.
        never.set()
        del store.runs.heartbeat  # the real statement again
        await signals.reconfirmed.wait(settings.stale_after * 2)
        assert lease.gate.open() and not lease.lapsed
    finally:
        lease.stop()
        assert await lease.wait_stopped(5)


def test_gate_is_closed_before_the_first_confirmation(settings: Settings) -> None:
    gate = LeaseGate(settings)
    assert not gate.open() and not gate.expired()
    gate.confirm(time.monotonic())
    assert gate.open()
    gate.confirm(time.monotonic() - 100)  # an older confirmation never moves it back
    assert gate.open()


def test_watchdog_fires_when_a_run_keeps_executing_past_the_failstop() -> None:
    fired: list[int] = []
    signals = WatchdogSignals()
    sent = time.monotonic()
    dog = Watchdog(
        confirmed_sent=lambda: sent,
        executing=lambda: 1,
        failstop_after=0.2,
        confirm=0.05,
        exit=fired.append,
        signals=signals,
    )
    dog.start()
    signals.failstop.wait_blocking(2)
    at = time.monotonic() - sent
    dog.stop()  # joins the thread: the exit call it was making has been made
    assert fired == [75]
    assert 0.25 <= at < 1.0
    assert signals.overdue.count == 1 and signals.spared.count == 0


def test_watchdog_spares_a_process_whose_runs_stop_within_the_confirm_window() -> None:
    """Thawed after SIGSTOP, overdue at once, but the runs stop in time: no exit."""
    fired: list[int] = []
    executing = [1]
    signals = WatchdogSignals()
    dog = Watchdog(
        confirmed_sent=lambda: time.monotonic() - 10,  # long overdue from the first poll
        executing=lambda: executing[0],
        failstop_after=0.2,
        confirm=0.3,
        exit=fired.append,
        signals=signals,
    )
    dog.stop()  # before start: harmless
    dog.start()
    signals.overdue.wait_blocking(2)
    time.sleep(0.1)  # the run takes a tenth of a second to stop, inside the 0.3 s window
    executing[0] = 0  # the lapse loop interrupted the run
    signals.spared.wait_blocking(2)
    dog.stop()
    dog.stop()  # twice is harmless
    assert fired == []
    assert signals.failstop.count == 0
