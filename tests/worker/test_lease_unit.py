"""The lease's parts one at a time, against the real store: gate, renewal, lapse, reconfirm,
liveness publishing. Time is a fake monotonic clock (``worker.lease.time``), so the lapse
margin is checked at its exact edge; runs are real drives of ``sr.holds`` bodies.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

import runfleet.worker.lease as lease_module
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.journal_records import ReleaseCause
from runfleet.store.types import Owner, Parked, RunStatus
from runfleet.worker.authoring.durable import Cause
from runfleet.worker.driver import Driver
from runfleet.worker.lease import Lease, LeaseGate, LeaseSignals, _wait
from tests.seed_rules import flows as sr
from tests.store.helpers import create, must_get
from tests.support.polling import until

ME = Owner("host-lease", 5151, "nonce-lease")


class Clock:
    """``time`` as ``worker.lease`` sees it: a monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(lease_module, "time", fake)
    return fake


@dataclass
class Rig:
    store: Store
    settings: Settings
    driver: Driver
    lease: Lease
    signals: LeaseSignals
    published: list[tuple[int, bool, int]] = field(default_factory=list)
    drives: dict[str, asyncio.Task[object]] = field(default_factory=dict)

    async def hold(self, run_id: str) -> None:
        """A run whose body runs (``sr.holds``) until something interrupts it."""
        await create(self.store, run_id, flow="sr.holds")
        self.drives[run_id] = asyncio.ensure_future(self.driver.drive(run_id))
        await until(
            lambda: _true_if(run_id in sr.STARTED), 10.0, f"{run_id}'s body to start", every=0.005
        )

    def cause(self, run_id: str) -> Cause | None:
        return self.driver.owned[run_id].cause

    async def finish(self) -> None:
        for task in self.drives.values():
            if not task.done():
                task.cancel()
        await asyncio.gather(*self.drives.values(), return_exceptions=True)


@pytest.fixture
async def rig(store: Store, settings: Settings, clock: Clock) -> AsyncIterator[Rig]:
    """A lease over a driver, confirmed once (its gate open, so the driver claims)."""
    sr.STARTED.clear()
    sr.STOPPED.clear()
    gate = LeaseGate(settings)
    driver = Driver(store, ME, settings, lease=gate)
    signals = LeaseSignals()
    published: list[tuple[int, bool, int]] = []

    async def refresh(confirmed_ms: int, lapsed: bool, runs: int) -> None:
        published.append((confirmed_ms, lapsed, runs))

    lease = Lease(store, driver, ME, settings, gate=gate, refresh_liveness=refresh, signals=signals)
    made = Rig(store, settings, driver, lease, signals, published)
    assert await lease.tick() is not None and gate.open()
    signals.renewed.clear()
    try:
        yield made
    finally:
        lease.stop()
        await made.finish()


async def _true_if(value: bool) -> bool:
    return value


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_gate_opens_on_a_confirmation_and_expires_exactly_at_the_lapse_margin(
    settings: Settings, clock: Clock
) -> None:
    gate = LeaseGate(settings)
    assert gate.confirmed_sent is None and gate.lapsed is False
    assert not gate.open() and not gate.expired(), "nothing confirmed: closed, not expired"
    clock.now = 0.0  # so that "now - sent" is the margin exactly, with no rounding
    gate.confirm(clock.now)
    assert gate.confirmed_sent == clock.now
    sent = clock.now
    clock.now = sent + settings.lapse_after - 0.001
    assert gate.open() and not gate.expired()
    clock.now = sent + settings.lapse_after
    assert gate.expired() and not gate.open(), "at the margin itself the lease is gone"
    gate.confirm(sent - 1.0)
    assert gate.confirmed_sent == sent, "an older confirmation never moves it back"
    gate.confirm(clock.now)
    assert gate.confirmed_sent == clock.now and gate.open()
    gate.lapsed = True
    assert not gate.open(), "a lapsed gate stays closed until the lease reconfirms it"
    assert not gate.expired(), "expiry is about the confirmation's age only"


async def test_a_renewal_confirms_what_it_renewed_and_interrupts_what_it_did_not(
    rig: Rig, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.lease")
    for run_id in ("kept", "gone", "cancelled"):
        await rig.hold(run_id)
    gone = rig.driver.owned["gone"].ctx
    parked = await rig.store.waits.release(
        "gone", ME, gone.epoch, ReleaseCause.INTERRUPTED, "shutdown"
    )
    assert isinstance(parked, Parked), "another drive of ours handed it back: not renewed now"
    await rig.store.lifecycle.request_cancel("cancelled")
    clock.now = 250.0
    beat = await rig.lease.tick()
    assert beat is not None
    assert beat.confirmed == {"kept", "cancelled"} and beat.cancel_requested == {"cancelled"}
    assert await rig.signals.renewed.wait(1) is beat
    assert rig.lease.gate.confirmed_sent == 250.0, "confirmed as of when it was sent"
    assert rig.lease.last_confirmed_ms == beat.now_ms
    assert rig.cause("kept") is None
    assert rig.cause("gone") is Cause.LOST_FENCE
    assert rig.cause("cancelled") is Cause.CANCELLED, "the body is told why it stops"
    (lost,) = [r for r in caplog.records if r.getMessage() == "run.fence_lost"]
    assert (lost.__dict__["run_id"], lost.__dict__["via"]) == ("gone", "heartbeat")
    await asyncio.wait_for(rig.drives["cancelled"], 10)
    assert (await must_get(rig.store, "cancelled")).status is RunStatus.CANCELLED
    (closed,) = [
        r for r in await rig.store.journal.records("cancelled") if r.kind == Kind.INTERRUPTED
    ]
    assert "found_at_release" not in closed.payload, "cancelled as such, not found at a release"
    await asyncio.wait_for(rig.drives["gone"], 10)
    assert "gone" in sr.STOPPED and "gone" not in rig.driver.owned
    assert rig.lease.gate.open() and not rig.lease.lapsed


async def test_a_failed_renewal_is_unconfirmed_counted_and_may_lapse_the_lease(
    rig: Rig, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.lease")
    await rig.hold("r")
    clock.now = 1024.0
    assert await rig.lease.tick() is not None
    assert await rig.signals.renewed.wait(1) is not None

    async def refused(*_args: object, **_kwargs: object) -> object:
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(rig.store.runs, "heartbeat", refused)
    before = sample("runfleet_infrastructure_errors_total", component="heartbeat")
    assert await rig.lease.tick() is None
    assert await rig.signals.renewed.wait(1) is None
    assert sample("runfleet_infrastructure_errors_total", component="heartbeat") == before + 1
    assert not rig.lease.lapsed and rig.cause("r") is None, "young confirmation: no lapse yet"
    clock.now = 1024.0 + rig.settings.lapse_after + 1e-6
    assert await rig.lease.tick() is None
    assert rig.lease.lapsed, "the failed renewal itself checks the lapse"
    assert rig.cause("r") is Cause.LEASE_LAPSED
    failed = [r for r in caplog.records if r.getMessage() == "lease.renew_failed"]
    assert len(failed) == 2 and failed[0].__dict__["runs"] == 1
    assert "connection refused" in failed[0].__dict__["error"]
    (lapsed,) = [r for r in caplog.records if r.getMessage() == "lease.lapsed"]
    assert lapsed.levelno == logging.ERROR
    assert (lapsed.__dict__["owner"], lapsed.__dict__["runs"]) == (ME.key, 1)


async def test_a_hanging_renewal_is_unconfirmed_after_one_interval_and_never_doubled(
    rig: Rig, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.lease")
    loop_errors: list[dict[str, object]] = []
    running_loop = asyncio.get_running_loop()
    previous_handler = running_loop.get_exception_handler()
    running_loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    confirmed = rig.lease.gate.confirmed_sent
    clock.now += 0.1  # the hanging renewal is sent later than the confirmed one
    answer = asyncio.Event()
    calls: list[list[str]] = []
    real = rig.store.runs.heartbeat

    async def hanging(me: Owner, run_ids: list[str], **kwargs: Any) -> object:
        calls.append(run_ids)
        await answer.wait()
        return await real(me, run_ids, **kwargs)

    monkeypatch.setattr(rig.store.runs, "heartbeat", hanging)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await rig.lease.tick() is None
    waited = loop.time() - began
    assert rig.settings.renew_timeout <= waited < rig.settings.renew_timeout + 1.0
    began = loop.time()
    assert await rig.lease.tick() is None, "the earlier renewal still hangs"
    assert loop.time() - began < rig.settings.renew_timeout / 2, "refused at once, not awaited"
    assert len(calls) == 1, "a renewal is never sent while the previous one hangs"
    answer.set()
    await until(lambda: _true_if(rig.lease._inflight is not None and rig.lease._inflight.done()))
    assert rig.lease.gate.confirmed_sent == confirmed, "a late answer confirms nothing"
    assert await rig.lease.tick() is not None and len(calls) == 2
    running_loop.set_exception_handler(previous_handler)
    ours = [  # the renewal's own, not another test's leftover callback error
        c for c in loop_errors if "hanging" in repr(c) or "NoneType" in repr(c.get("exception"))
    ]
    assert ours == [], "the late renewal's end is consumed quietly"
    errors = [r.__dict__["error"] for r in caplog.records if r.getMessage() == "lease.renew_failed"]
    assert errors == [
        "TimeoutError('renewal not confirmed within one interval')",
        "TimeoutError('previous renewal still in flight')",
    ]


def test_the_unconfirmed_gap_grows_while_lapsed_and_is_kept_once_reconfirmed(
    settings: Settings, clock: Clock
) -> None:
    gate = LeaseGate(settings)
    assert gate.unconfirmed_ms() is None and gate.gap_ms(clock.now) is None, "never confirmed"
    gate.confirm(clock.now)
    clock.now += 1.0
    assert gate.unconfirmed_ms() is None, "never lapsed: no gap to tell"
    assert gate.gap_ms(clock.now) == 1000
    gate.confirm(clock.now)
    assert gate.unconfirmed_ms() is None, "a confirmation outside a lapse ends no lapse"
    gate.lapsed = True
    clock.now += 2.25
    assert gate.unconfirmed_ms() == 2250, "while it lasts: so far, by the monotonic clock"
    clock.now += 0.5
    assert gate.unconfirmed_ms() == 2750
    gate.confirm(clock.now)  # the renewal that ends the lapse
    gate.lapsed = False
    clock.now += 9.0
    gate.confirm(clock.now)
    assert gate.last_gap_ms == 2750, "later confirmations leave the lapse's gap alone"
    assert gate.unconfirmed_ms() == 2750, "once over: up to the renewal that ended it"


async def test_a_lapse_interrupts_every_run_once_and_closes_the_gate(
    rig: Rig, clock: Clock
) -> None:
    for run_id in ("a", "b"):
        await rig.hold(run_id)
    clock.now = 1024.0
    assert await rig.lease.tick() is not None
    rig.lease.check_lapse()
    assert not rig.lease.lapsed and rig.signals.lapsed.count == 0
    clock.now = 1024.0 + rig.settings.lapse_after - 0.001
    rig.lease.check_lapse()
    assert not rig.lease.lapsed
    clock.now = 1024.0 + rig.settings.lapse_after + 1e-6
    before = sample("runfleet_lease_lapses_total")
    rig.lease._publish_now.clear()
    rig.lease.check_lapse()
    assert rig.lease.lapsed and not rig.lease.gate.open()
    assert rig.signals.lapsed.count == 1
    assert sample("runfleet_lease_lapses_total") == before + 1
    assert rig.lease._publish_now.is_set(), "the liveness key says lapsed at once"
    assert {rig.cause("a"), rig.cause("b")} == {Cause.LEASE_LAPSED}
    rig.lease.check_lapse()
    assert rig.signals.lapsed.count == 1 and sample("runfleet_lease_lapses_total") == before + 1
    for run_id in ("a", "b"):
        await asyncio.wait_for(rig.drives[run_id], 10)
        released = [
            r for r in await rig.store.journal.records(run_id) if r.kind == Kind.INTERRUPT_RELEASED
        ]
        assert [r.payload["cause"] for r in released] == ["lease-lapsed"]


async def test_a_confirmation_after_a_lapse_reopens_the_gate_and_journals_it(
    rig: Rig, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rig.hold("r")
    assert await rig.lease.tick() is not None
    rig.lease.gate.lapsed = True  # as check_lapse leaves it, with the run still held
    rig.lease._publish_now.clear()
    beat = await rig.lease.tick()
    assert beat is not None and not rig.lease.lapsed and rig.lease.gate.open()
    assert rig.signals.reconfirmed.count == 1
    assert rig.lease._publish_now.is_set()
    (record,) = [r for r in await rig.store.journal.records("r") if r.kind == "lease-reconfirmed"]
    assert record.payload["owner"] == ME.key
    assert record.payload["confirmed_ms"] == beat.now_ms
    assert await rig.lease.tick() is not None
    assert rig.signals.reconfirmed.count == 1, "only the first confirmation after a lapse"

    async def broken(*_args: object, **_kwargs: object) -> object:
        raise psycopg.OperationalError("journal unreachable")

    monkeypatch.setattr(rig.store.journal, "emit", broken)
    rig.lease.gate.lapsed = True
    assert await rig.lease.tick() is not None, "an audit record never stops the lease"
    assert not rig.lease.lapsed


async def test_the_liveness_key_says_lapsed_until_confirmed_and_failures_are_counted(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.lease")
    seen: list[tuple[int, bool, int]] = []
    mode: list[str] = ["ok"]
    driver = Driver(store, ME, settings)
    signals = LeaseSignals()

    async def refresh(confirmed_ms: int, lapsed: bool, runs: int) -> None:
        if mode[0] == "fail":
            raise ConnectionError("redis down")
        if mode[0] == "hang":
            await asyncio.Event().wait()
        seen.append((confirmed_ms, lapsed, runs))

    lease = Lease(store, driver, ME, settings, refresh_liveness=refresh, signals=signals)
    await lease.publish()
    assert seen == [(0, True, 0)], "before its first confirmation a process vouches for nothing"
    assert await signals.published.wait(1) is True
    beat = await lease.tick()
    assert beat is not None
    await lease.publish()
    assert seen[-1] == (beat.now_ms, False, 0)
    lease.gate.lapsed = True
    await lease.publish()
    assert seen[-1] == (beat.now_ms, True, 0)
    before = sample("runfleet_infrastructure_errors_total", component="liveness")
    mode[0] = "fail"
    await lease.publish()
    assert signals.published.count == 4
    assert await signals.published.until(lambda written: not written, 1) is False
    assert sample("runfleet_infrastructure_errors_total", component="liveness") == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "liveness.refresh_failed"]
    assert "redis down" in line.__dict__["error"]
    mode[0] = "hang"
    loop = asyncio.get_running_loop()
    began = loop.time()
    await lease.publish()
    assert loop.time() - began < settings.liveness_timeout + 0.5, "bounded by liveness_timeout"
    assert await signals.published.wait(1) is False
    quiet = Lease(store, driver, ME, settings, signals=LeaseSignals())
    await quiet.publish()  # no refresh function: nothing to write, nothing signalled
    assert quiet._signals is not None and quiet._signals.published.count == 0


async def test_wait_returns_on_either_event_or_at_its_timeout() -> None:
    loop = asyncio.get_running_loop()

    async def timed(call: Callable[[], Awaitable[None]]) -> float:
        began = loop.time()
        await call()
        return loop.time() - began

    first, second = asyncio.Event(), asyncio.Event()
    first.set()
    assert await timed(lambda: _wait(first, 5.0)) < 1.0
    first.clear()
    second.set()
    assert await timed(lambda: _wait(first, 5.0, also=second)) < 1.0
    second.clear()
    assert 0.2 <= await timed(lambda: _wait(first, 0.2, also=second)) < 2.0
    assert await timed(lambda: _wait(first, 0.0)) < 0.05
    assert await timed(lambda: _wait(first, -1.0)) < 0.05
    await asyncio.sleep(0)  # let the cancelled waiters finish
    pending = [t for t in asyncio.all_tasks() if "Event.wait" in repr(t)]
    assert pending == [], "the waiters are cancelled when the wait ends"


async def test_the_running_lease_renews_every_interval_and_stops_when_asked(
    store: Store, settings: Settings
) -> None:
    published: list[bool] = []

    async def refresh(_confirmed: int, lapsed: bool, _runs: int) -> None:
        published.append(lapsed)

    signals = LeaseSignals()
    lease = Lease(
        store, Driver(store, ME, settings), ME, settings, refresh_liveness=refresh, signals=signals
    )
    lease.start()
    try:
        beats = [await signals.renewed.wait(settings.stale_after) for _ in range(3)]
        assert all(beat is not None for beat in beats)
        assert await signals.published.wait(settings.stale_after) is True
        assert lease.gate.open()
    finally:
        lease.stop()
        assert await lease.wait_stopped(5)
    assert signals.lapsed.count == 0 and published
    count = signals.renewed.count
    await asyncio.sleep(settings.heartbeat_interval * 2)
    assert signals.renewed.count == count, "no renewal after stop"


async def test_every_run_still_held_after_a_lapse_gets_its_own_reconfirmed_record(
    rig: Rig, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.lease")
    for run_id in ("a", "b"):
        await rig.hold(run_id)
    rig.lease.gate.lapsed = True
    clock.now += 2.5  # the renewal ending the lapse is sent 2.5 s after the last confirmed
    beat = await rig.lease.tick()
    assert beat is not None and rig.lease.lapsed is False
    for run_id in ("a", "b"):
        records = [
            r for r in await rig.store.journal.records(run_id) if r.kind == "lease-reconfirmed"
        ]
        assert len(records) == 1, f"{run_id}: one record each, at addresses of their own"
        row = await rig.store.runs.get(run_id)
        assert row is not None  # the lease confirmed is the heartbeat this renewal wrote
        assert records[0].payload["confirmed_ms"] == row.heartbeat_at_ms
        assert records[0].payload["unconfirmed_ms"] == 2500
    (line,) = [r for r in caplog.records if r.getMessage() == "lease.reconfirmed"]
    assert line.__dict__["owner"] == ME.key
    assert line.__dict__["unconfirmed_ms"] == 2500, "the gap the lapse left"
    assert line.__dict__["runs"] == 2, "the runs it journaled reconfirmed"


async def test_the_lapse_loop_lapses_on_its_own_timer_and_ends_when_stopped(
    rig: Rig, clock: Clock
) -> None:
    """Without any renewal running (none would check): the lapse loop alone notices."""
    await rig.hold("r")
    clock.now += rig.settings.lapse_after + 1.0
    loop_task = asyncio.ensure_future(rig.lease._lapse_loop())
    try:
        await rig.signals.lapsed.wait(5)
        assert rig.cause("r") is Cause.LEASE_LAPSED
    finally:
        rig.lease._stopping.set()
        await asyncio.wait_for(loop_task, 5)


async def test_the_running_lease_names_its_loops_and_stops_at_once(
    store: Store, settings: Settings
) -> None:
    """Stop wakes every loop, the liveness one waiting a whole (long) interval included."""
    slow = settings.model_copy(update={"heartbeat_interval": 5.0, "stale_after": 25.0})

    async def refresh(_confirmed: int, _lapsed: bool, _runs: int) -> None:
        return None

    signals = LeaseSignals()
    lease = Lease(
        store, Driver(store, ME, slow), ME, slow, refresh_liveness=refresh, signals=signals
    )
    lease.start()
    assert await signals.renewed.wait(5) is not None
    assert await signals.published.wait(5) is True
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert {"lease-renew", "lease-lapse", "lease-liveness"} <= names
    loop = asyncio.get_running_loop()
    began = loop.time()
    lease.stop()
    assert await lease.wait_stopped(2.0), "stop did not wake a loop"
    assert loop.time() - began < 2.0


async def test_renewals_keep_their_interval_when_each_takes_a_while(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pause after a renewal is the interval less the renewal's own time."""
    real = store.runs.heartbeat
    took = settings.heartbeat_interval * 0.75

    async def slow(me: Owner, run_ids: list[str], **kwargs: Any) -> object:
        await asyncio.sleep(took)
        return await real(me, run_ids, **kwargs)

    monkeypatch.setattr(store.runs, "heartbeat", slow)
    signals = LeaseSignals()
    lease = Lease(store, Driver(store, ME, settings), ME, settings, signals=signals)
    loop = asyncio.get_running_loop()
    lease.start()
    try:
        await signals.renewed.wait(5)
        began = loop.time()
        for _ in range(4):
            assert await signals.renewed.wait(5) is not None
        period = (loop.time() - began) / 4
    finally:
        lease.stop()
        assert await lease.wait_stopped(5)
    interval = settings.heartbeat_interval
    assert period < interval + took * 0.8, f"{period:.3f} s between renewals"


async def test_a_late_renewal_that_fails_is_consumed_not_reported_as_lost(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its answer is ignored, and so is its error: no "exception was never retrieved"."""
    answer = asyncio.Event()

    async def hanging_then_failing(*_args: object, **_kwargs: object) -> object:
        await answer.wait()
        raise psycopg.OperationalError("late and broken")

    monkeypatch.setattr(rig.store.runs, "heartbeat", hanging_then_failing)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        assert await rig.lease.tick() is None
        late = rig.lease._inflight
        assert late is not None
        answer.set()
        await asyncio.wait({late})
        rig.lease._inflight = None
        del late
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c for c in errors if "late and broken" in repr(c)] == []


async def test_a_run_coroutine_closed_from_outside_gives_its_generator_exit_back(rig: Rig) -> None:
    """A pending run task collected at shutdown has its coroutine closed outside the task.

    ``close()`` throws ``GeneratorExit`` in at the await point and needs it back; wrapped as
    the run's own ``UserBaseException`` it escaped ``close()`` ("Exception ignored in
    <coroutine Driver._call>"). A ``GeneratorExit`` the body raises itself still fails the
    run (tests/security/test_user_code.py).
    """
    await rig.hold("closing")
    body = rig.driver._call(sr.holds, rig.driver.owned["closing"].ctx)
    # One step in a context of its own, as its task would take it; then the collector's close.
    contextvars.copy_context().run(body.send, None)
    assert body.close() is None


def test_a_gap_is_whole_milliseconds_from_the_newest_confirmed_send(settings: Settings) -> None:
    gate = LeaseGate(settings)
    assert gate.gap_ms(5.0) is None, "nothing confirmed yet"
    gate.confirm(5.0)
    assert gate.gap_ms(5.0) == 0, "no time since the confirmed send: no gap"
    assert gate.gap_ms(5.0009) == 0, "under a millisecond rounds down"
    assert gate.gap_ms(5.25) == 250


async def test_a_renewal_skips_a_locked_row_and_only_that_run_lapses_at_the_margin(
    rig: Rig, clock: Clock, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another transaction holds one run's row (a producer may ``SELECT ... FOR UPDATE``
    its own run): the renewal skips it instead of waiting, the process stays confirmed,
    and at ``lapse_after`` from its last renewal that run alone lapses; it is released
    once its row is free."""
    caplog.set_level(logging.INFO, logger="runfleet.worker.lease")
    for run_id in ("kept", "locked"):
        await rig.hold(run_id)
    clock.now = 500.0
    assert await rig.lease.tick() is not None
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        await other.execute("SELECT id FROM runfleet.runs WHERE id = 'locked' FOR UPDATE")
        clock.now = 500.0 + rig.settings.lapse_after - 0.001
        beat = await asyncio.wait_for(rig.lease.tick(), 5)
        assert beat is not None, "the renewal answered without waiting on the lock"
        assert beat.confirmed == {"kept"} and beat.skipped == {"locked"}
        assert rig.cause("locked") is None, "skipped is not a lost fence"
        assert rig.lease.gate.open() and not rig.lease.lapsed
        clock.now = 500.0 + rig.settings.lapse_after
        assert await rig.lease.tick() is not None
        assert rig.cause("locked") is Cause.LEASE_LAPSED, "at the margin, that run alone"
        assert rig.cause("kept") is None and rig.lease.gate.open()
        assert not rig.drives["locked"].done(), "its release waits for its own row"
        await other.rollback()
    await asyncio.wait_for(rig.drives["locked"], 10)
    row = await must_get(rig.store, "locked")
    assert row.status is RunStatus.SUSPENDED and row.owner is None
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("lease.renew_skipped") == 1 and "lease.run_lapsed" in messages
    assert "lease.lapsed" not in messages
