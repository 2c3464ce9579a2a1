"""The process lease: one renewal statement per interval for every run this process owns.

A run missing from the confirmed set lost its fence and is interrupted at once.
If no renewal is confirmed for ``settings.lapse_after`` (measured on the
monotonic clock), the process stops executing every run it owns before anyone
could consider the lease stale, says so in its liveness key, and releases the
runs once the database answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from store import Store
from store.config import Settings
from store.types import Heartbeat, Owner
from worker import metrics
from worker.driver import Driver

log = logging.getLogger("runfleet.worker.lease")

RefreshFn = Callable[[int, bool, int], Awaitable[None]]
"""(confirmed_ms, lapsed, runs owned) -> refresh this process's liveness key."""


class Lease:
    def __init__(
        self,
        store: Store,
        driver: Driver,
        owner: Owner,
        settings: Settings,
        *,
        refresh_liveness: RefreshFn | None = None,
    ) -> None:
        self._store = store
        self._driver = driver
        self._owner = owner
        self._settings = settings
        self._refresh = refresh_liveness
        self.last_confirmed = time.monotonic()
        self.last_confirmed_ms = 0
        self.lapsed = False
        self._inflight: asyncio.Task[Heartbeat] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Renew every interval until ``stop`` is set."""
        interval = self._settings.heartbeat_interval
        while not stop.is_set():
            started = time.monotonic()
            await self.tick()
            elapsed = time.monotonic() - started
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval - elapsed))
            except TimeoutError:
                pass

    async def tick(self) -> Heartbeat | None:
        owned = list(self._driver.owned)
        try:
            beat = await self._renew(owned)
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("heartbeat").inc()
            log.warning("lease.renew_failed", extra={"error": repr(exc), "runs": len(owned)})
            self._check_lapse()
            await self._publish()
            return None
        self.last_confirmed = time.monotonic()
        self.last_confirmed_ms = beat.now_ms
        for run_id in owned:
            if run_id not in beat.confirmed and self._driver.interrupt(run_id, "lost-fence"):
                log.warning("run.fence_lost", extra={"run_id": run_id, "via": "heartbeat"})
        for run_id in beat.cancel_requested:
            self._driver.interrupt(run_id, "cancelled")
        if self.lapsed:
            self.lapsed = False
            log.info("lease.reconfirmed", extra={"owner": self._owner.key})
        await self._publish()
        return beat

    async def _renew(self, owned: list[str]) -> Heartbeat:
        """One renewal, waited for at most one interval.

        The statement runs in its own task that is never cancelled: cancelling a
        psycopg query against a partitioned server waits for the cancel request,
        which would freeze this loop — and a frozen lease loop can neither notice
        its own lapse nor keep its liveness key honest. A renewal still hanging
        from an earlier tick counts as unconfirmed; its late answer is ignored.
        """
        if self._inflight is not None and not self._inflight.done():
            raise TimeoutError("previous renewal still in flight")
        task = asyncio.create_task(self._store.runs.heartbeat(self._owner, owned))
        self._inflight = task
        task.add_done_callback(_consume)
        done, _ = await asyncio.wait({task}, timeout=self._settings.heartbeat_interval)
        if not done:
            raise TimeoutError("renewal not confirmed within one interval")
        return task.result()

    def _check_lapse(self) -> None:
        if self.lapsed:
            return
        if time.monotonic() - self.last_confirmed < self._settings.lapse_after:
            return
        self.lapsed = True
        metrics.LEASE_LAPSES.inc()
        log.error("lease.lapsed", extra={"owner": self._owner.key, "runs": len(self._driver.owned)})
        for run_id in list(self._driver.owned):
            self._driver.interrupt(run_id, "lease-lapsed")

    async def _publish(self) -> None:
        if self._refresh is None:
            return
        try:
            await self._refresh(self.last_confirmed_ms, self.lapsed, len(self._driver.owned))
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("liveness").inc()
            log.warning("liveness.refresh_failed", extra={"error": repr(exc)})


def _consume(task: asyncio.Task[Heartbeat]) -> None:
    """Retrieve a finished renewal's exception so a late failure is not reported as lost."""
    if not task.cancelled():
        task.exception()
