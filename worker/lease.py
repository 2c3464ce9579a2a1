"""The process lease: one renewal statement per interval for every run this process owns.

A run missing from the confirmed set lost its fence and is interrupted at once.
Three loops, none waiting on another (DESIGN §5, rules learnt from partitions):

- renewal: every interval, one heartbeat statement on the lease's own connection
  (never behind the shared pool); an answer later than one interval counts as
  unconfirmed, and a renewal still hanging blocks nothing;
- lapse check: on its own short timer, measured from when the newest *confirmed*
  renewal was *sent*; past ``settings.lapse_after`` every run is interrupted and the
  gate closes, so the process claims, reads and writes nothing until a renewal is
  confirmed again. Any observer sees the lease stale only ``stale_after`` after that
  renewal reached the database, which is later still;
- liveness: the Redis key is written on its own loop with a bound well under one
  interval; Redis being slow or gone never delays a renewal or a lapse.

A renewal never waits on a row lock (``runs.heartbeat`` skips locked rows): any
producer may ``SELECT ... FOR UPDATE`` its own run's row, and a renewal that waited on
it would lapse the whole process and every other tenant's run in it. A skipped run is
still ours, so it is not a lost fence; the process's lease is confirmed (the database
answered). The run alone was not renewed: that is logged (``lease.renew_skipped`` once,
``lease.renew_resumed`` when a renewal takes it again) and retried every beat, and if it
stays unrenewed for ``lapse_after`` that run alone lapses: it is interrupted and released
(journaled ``interrupt-released``, cause ``lease-lapsed``) once its row is free, as the
whole process would be, so nobody may steal it while it still executes here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import runfleet.worker.metrics as metrics
from runfleet.runtime.service import Service, Signal
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Heartbeat, Owner, Reconfirmation
from runfleet.worker.authoring.durable import Cause
from runfleet.worker.driver import Driver

log = logging.getLogger("runfleet.worker.lease")

RefreshFn = Callable[[int, bool, int], Awaitable[None]]
"""(confirmed_ms, lapsed, runs owned) -> refresh this process's liveness key."""


class LeaseGate:
    """The local, I/O-free answer to "may this process act for its runs right now?".

    Read by every durable call, by the driver before a claim, by the stream reader
    and by the fail-stop watchdog thread; written only by the lease loops.
    """

    def __init__(self, settings: Settings) -> None:
        self._lapse_after = settings.lapse_after
        self.confirmed_sent: float | None = None
        """Monotonic send time of the newest confirmed renewal (None before the first)."""
        self.lapsed = False
        self.last_gap_ms: int | None = None
        """How long the lease went unconfirmed in the newest lapse that ended."""

    def confirm(self, sent: float) -> None:
        if self.confirmed_sent is None or sent > self.confirmed_sent:
            if self.lapsed and self.confirmed_sent is not None:  # the renewal ending a lapse
                self.last_gap_ms = _ms(sent - self.confirmed_sent)
            self.confirmed_sent = sent

    def gap_ms(self, sent: float) -> int | None:
        """Milliseconds from the send of the newest confirmed renewal to ``sent``."""
        return None if self.confirmed_sent is None else _ms(sent - self.confirmed_sent)

    def unconfirmed_ms(self) -> int | None:
        """How long the lease went unconfirmed in the newest lapse: so far while it lasts,
        up to the send of the renewal that ended it once over; None if it never lapsed.

        On the monotonic clock the lapse itself is decided on, from the send of the newest
        confirmed renewal (a lapse release journals it).
        """
        if self.lapsed:
            return self.gap_ms(time.monotonic())
        return self.last_gap_ms

    def expired(self) -> bool:
        sent = self.confirmed_sent
        return sent is not None and time.monotonic() - sent >= self._lapse_after

    def open(self) -> bool:
        """True while the newest confirmed renewal is younger than the lapse margin."""
        sent = self.confirmed_sent
        return not self.lapsed and sent is not None and time.monotonic() - sent < self._lapse_after


@dataclass(frozen=True)
class LeaseSignals:
    """Points of the lease a test waits on instead of polling (``runtime.service.Signal``)."""

    renewed: Signal[Heartbeat | None] = field(default_factory=Signal)
    """Each renewal attempt: its heartbeat, or None if it was not confirmed in time."""
    lapsed: Signal[None] = field(default_factory=Signal)
    """The gate closed and every run was interrupted."""
    reconfirmed: Signal[None] = field(default_factory=Signal)
    """A renewal was confirmed again after a lapse; the gate is open."""
    published: Signal[bool] = field(default_factory=Signal)
    """A liveness write ended: True if it was written, False if it failed or timed out."""


class Lease(Service):
    """The lease as a service (``runtime.service``): ``start``/``stop``, or ``run(stop)``.

    ``tick`` and ``check_lapse`` are one renewal and one lapse check; the worker calls
    ``tick`` once before it starts the service, tests call both directly.
    """

    name = "lease"

    def __init__(
        self,
        store: Store,
        driver: Driver,
        owner: Owner,
        settings: Settings,
        *,
        gate: LeaseGate | None = None,
        refresh_liveness: RefreshFn | None = None,
        signals: LeaseSignals | None = None,
    ) -> None:
        super().__init__()
        self._signals = signals
        self._store = store
        self._driver = driver
        self._owner = owner
        self._settings = settings
        self._refresh = refresh_liveness
        self.gate = gate or LeaseGate(settings)
        self.last_confirmed_ms = 0
        self._inflight: asyncio.Task[Heartbeat] | None = None
        self._publish_now = asyncio.Event()
        self._skipped_since: dict[str, float] = {}
        """Runs whose renewal skipped their locked row -> monotonic send time of the
        newest renewal that did renew them (a run lapses alone ``lapse_after`` later)."""
        self._lapsed_alone: set[str] = set()

    @property
    def lapsed(self) -> bool:
        return self.gate.lapsed

    async def _serve(self) -> None:
        """Renew, watch for a lapse and keep the liveness key fresh until stopped."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._renew_loop(), name="lease-renew")
            tg.create_task(self._lapse_loop(), name="lease-lapse")
            tg.create_task(self._liveness_loop(), name="lease-liveness")

    async def _renew_loop(self) -> None:
        interval = self._settings.heartbeat_interval
        while not self.stopping:
            started = time.monotonic()
            await self.tick()
            await self._pause(interval - (time.monotonic() - started))

    async def _lapse_loop(self) -> None:
        period = self._settings.lapse_check_every
        while not self.stopping:
            self.check_lapse()
            await self._pause(period)

    async def _liveness_loop(self) -> None:
        while not self.stopping:
            self._publish_now.clear()
            await self.publish()
            await _wait(self._publish_now, self._settings.heartbeat_interval, also=self._stopping)

    async def tick(self) -> Heartbeat | None:
        """One renewal of every owned run; None if it was not confirmed within one interval.

        Sent while lapsed, the renewal journals ``lease-reconfirmed`` itself, fenced: only
        on the runs it renews at the epoch this process holds them at (``Reconfirmation``).
        """
        epochs = {run_id: run.ctx.epoch for run_id, run in list(self._driver.owned.items())}
        owned = list(epochs)
        sent = time.monotonic()
        gap = self.gate.gap_ms(sent)
        reconfirm = (
            Reconfirmation(epochs=epochs, unconfirmed_ms=gap)
            if self.gate.lapsed and gap is not None
            else None
        )
        try:
            beat = await self._renew(owned, reconfirm)
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("heartbeat").inc()
            log.warning("lease.renew_failed", extra={"error": repr(exc), "runs": len(owned)})
            self.check_lapse()
            if self._signals is not None:
                self._signals.renewed.fire(None)
            return None
        renewed_before = self.gate.confirmed_sent
        self.gate.confirm(sent)
        self.last_confirmed_ms = beat.now_ms
        self._note_skipped(owned, beat, renewed_before if renewed_before is not None else sent)
        for run_id in owned:
            if run_id in beat.confirmed or run_id in beat.skipped:
                continue
            if self._driver.interrupt(run_id, Cause.LOST_FENCE):
                log.warning("run.fence_lost", extra={"run_id": run_id, "via": "heartbeat"})
        self._lapse_skipped()
        for run_id in beat.cancel_requested:
            self._driver.interrupt(run_id, Cause.CANCELLED)
        if self.gate.lapsed:
            self._reconfirmed(beat)
        if self._signals is not None:
            self._signals.renewed.fire(beat)
        return beat

    async def _renew(self, owned: list[str], reconfirm: Reconfirmation | None) -> Heartbeat:
        """One renewal, waited for at most one interval.

        The statement runs in its own task that is never cancelled: cancelling a
        psycopg query against a partitioned server waits for the cancel request,
        which would freeze this loop. A renewal still hanging from an earlier tick
        counts as unconfirmed; its late answer is ignored (a lapse that comes a
        little early is safe, one that comes late is not).
        """
        if self._inflight is not None and not self._inflight.done():
            raise TimeoutError("previous renewal still in flight")
        task = asyncio.create_task(
            self._store.runs.heartbeat(self._owner, owned, reconfirm=reconfirm)
        )
        self._inflight = task
        task.add_done_callback(_consume)
        done, _ = await asyncio.wait({task}, timeout=self._settings.renew_timeout)
        if not done:
            raise TimeoutError("renewal not confirmed within one interval")
        return task.result()

    def _note_skipped(self, owned: list[str], beat: Heartbeat, renewed_before: float) -> None:
        """Keep, per run, since when its renewals have skipped its locked row."""
        for run_id in beat.skipped:
            if run_id not in self._skipped_since:
                self._skipped_since[run_id] = renewed_before
                metrics.LEASE_SKIPS.inc()
                log.warning(
                    "lease.renew_skipped", extra={"run_id": run_id, "owner": self._owner.key}
                )
        for run_id in list(self._skipped_since):
            if run_id in beat.skipped:
                continue
            since = self._skipped_since.pop(run_id)
            self._lapsed_alone.discard(run_id)
            if run_id in beat.confirmed:
                log.info(
                    "lease.renew_resumed",
                    extra={"run_id": run_id, "skipped_ms": _ms(time.monotonic() - since)},
                )
        still = set(owned)
        self._lapsed_alone &= still

    def _lapse_skipped(self) -> None:
        """A run whose row stayed locked for ``lapse_after`` lapses alone: interrupted now,
        released by its drive once the row is free (before anyone may steal it)."""
        now = time.monotonic()
        for run_id, since in list(self._skipped_since.items()):
            if run_id in self._lapsed_alone or now - since < self._settings.lapse_after:
                continue
            self._lapsed_alone.add(run_id)
            if self._driver.interrupt(run_id, Cause.LEASE_LAPSED):
                metrics.LEASE_RUN_LAPSES.inc()
                log.error(
                    "lease.run_lapsed",
                    extra={"run_id": run_id, "unrenewed_ms": _ms(now - since)},
                )

    def check_lapse(self) -> None:
        """Lapse once the newest confirmed renewal is ``lapse_after`` old: stop every run.

        Also lapses, alone, each run whose locked row no renewal could take for as long."""
        self._lapse_skipped()
        if self.gate.lapsed or not self.gate.expired():
            return
        self.gate.lapsed = True
        metrics.LEASE_LAPSES.inc()
        log.error("lease.lapsed", extra={"owner": self._owner.key, "runs": len(self._driver.owned)})
        for run_id in list(self._driver.owned):
            self._driver.interrupt(run_id, Cause.LEASE_LAPSED)
        self._publish_now.set()
        if self._signals is not None:
            self._signals.lapsed.fire(None)

    def _reconfirmed(self, beat: Heartbeat) -> None:
        """The database answers again after a lapse: reopen the gate.

        The runs interrupted by the lapse are released by their drives (journaling how
        long the lease went unconfirmed); the renewal that ended the lapse journaled
        ``lease-reconfirmed`` on each run it still held, so an operator reading a run's
        journal sees the gap and its end.
        """
        self.gate.lapsed = False
        self._publish_now.set()
        log.info(
            "lease.reconfirmed",
            extra={
                "owner": self._owner.key,
                "unconfirmed_ms": self.gate.last_gap_ms,
                "runs": len(beat.reconfirmed),
            },
        )
        if self._signals is not None:
            self._signals.reconfirmed.fire(None)

    async def publish(self) -> None:
        """Write the liveness key, bounded well under one interval; failures are logged."""
        if self._refresh is None:
            return
        try:
            async with asyncio.timeout(self._settings.liveness_timeout):
                # Before its first confirmation a process holds nothing: say "lapsed"
                # rather than vouch with a confirmed time of 0.
                lapsed = self.gate.lapsed or self.gate.confirmed_sent is None
                await self._refresh(self.last_confirmed_ms, lapsed, len(self._driver.owned))
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("liveness").inc()
            log.warning("liveness.refresh_failed", extra={"error": repr(exc)})
            written = False
        else:
            written = True
        if self._signals is not None:
            self._signals.published.fire(written)


async def _wait(event: asyncio.Event, timeout: float, *, also: asyncio.Event | None = None) -> None:
    """Wait until ``event`` (or ``also``) is set or ``timeout`` passes."""
    if timeout <= 0:
        return
    waiters = {asyncio.ensure_future(event.wait())}
    if also is not None:
        waiters.add(asyncio.ensure_future(also.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def _consume(task: asyncio.Task[Heartbeat]) -> None:
    """Retrieve a finished renewal's exception so a late failure is not reported as lost."""
    if not task.cancelled():
        task.exception()
