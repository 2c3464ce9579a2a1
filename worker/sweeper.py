"""The five sweeps (DESIGN §7): how runs that no message will ever mention get driven.

Every tick, each sweep kind takes a transaction-scoped advisory lock so normally
one worker of the fleet performs it (the CAS keeps overlapping sweeps correct
anyway), reads a batch-capped, oldest-first slice, and dispatches each run:
a wake message on its queue's stream, or — if Redis cannot take it — a local
drive. Sweeps only dispatch; the driver decides. A failing sweep is logged and
tried again next tick; it never stops the sweeper.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from store import Store, SweepKind
from store.config import Settings
from store.types import PendingCursor
from worker import metrics

log = logging.getLogger("runfleet.worker.sweeper")

DispatchFn = Callable[[list[str], str], Awaitable[None]]
"""(run ids, reason) -> get those runs driven somewhere in the fleet."""


class Sweeper:
    def __init__(self, store: Store, settings: Settings, dispatch: DispatchFn) -> None:
        self._store = store
        self._settings = settings
        self._dispatch = dispatch
        self._batch = settings.sweep_batch
        self._pending_cursor: PendingCursor | None = None
        self._pending_through: PendingCursor | None = None
        self._cancel_cursor: PendingCursor | None = None
        self._cycle_started = float("-inf")

    async def run(self, stop: asyncio.Event) -> None:
        interval = self._settings.sweep_interval
        while not stop.is_set():
            await self.tick()
            jitter = interval * random.uniform(0.8, 1.2)
            try:
                await asyncio.wait_for(stop.wait(), timeout=jitter)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        for kind, sweep in (
            (SweepKind.PARKED, self._parked),
            (SweepKind.STALE_RUNNING, self._stale_running),
            (SweepKind.DUE_CLOCKS, self._due),
            (SweepKind.PENDING_CANCELLATIONS, self._pending_cancellations),
            (SweepKind.LOST_PENDING, self._lost_pending),
        ):
            started = time.monotonic()
            try:
                async with self._store.transaction():
                    if not await self._store.sweeps.try_lock(kind):
                        continue
                    run_ids = await sweep()
            except Exception as exc:
                metrics.INFRA_ERRORS.labels(f"sweep:{kind.name.lower()}").inc()
                log.warning(
                    "sweep.failed", extra={"kind": kind.name, "error": repr(exc)}, exc_info=True
                )
                continue
            metrics.SWEEP_DURATION.labels(kind.name.lower()).observe(time.monotonic() - started)
            metrics.SWEEP_BATCH.labels(kind.name.lower()).observe(len(run_ids))
            if run_ids:
                log.debug("sweep.dispatch", extra={"kind": kind.name, "runs": len(run_ids)})
                try:
                    await self._dispatch(run_ids, f"sweep:{kind.name.lower()}")
                except Exception as exc:
                    log.warning(
                        "sweep.dispatch_failed", extra={"kind": kind.name, "error": repr(exc)}
                    )

    async def _parked(self) -> list[str]:
        """Parked runs a cancel reached, and runs released by a shutdown or a lapse."""
        waits = self._store.waits
        cancelled = await waits.waiting_runs(cancel_requested=True, limit=self._batch)
        released = await waits.waiting_runs(reason="released", limit=self._batch)
        return _unique([w.run_id for w in cancelled + released])[: self._batch]

    async def _stale_running(self) -> list[str]:
        stale = await self._store.sweeps.stale_running(
            self._settings.stale_after_ms, limit=self._batch
        )
        return [s.run_id for s in stale]

    async def _due(self) -> list[str]:
        """Fire due clocks, dispatch due timed waits, and cancel runs past their deadline."""
        run_ids: list[str] = []
        for clock in await self._store.waits.due_clocks(limit=self._batch):
            await self._store.waits.complete_clock(clock.run_id, clock.name)
            run_ids.append(clock.run_id)
        due = await self._store.waits.waiting_runs(due_now=True, limit=self._batch)
        run_ids.extend(w.run_id for w in due if w.reason != "quarantine")
        for run_id in await self._store.steps.deadline_passed(limit=self._batch):
            await self._store.lifecycle.request_cancel(run_id, actor="deadline", reason="deadline")
            run_ids.append(run_id)
        return _unique(run_ids)[: self._batch]

    async def _pending_cancellations(self) -> list[str]:
        found = await self._store.sweeps.pending_cancellations(
            after=self._cancel_cursor, limit=self._batch
        )
        self._cancel_cursor = found[-1] if len(found) == self._batch else None
        return [c.run_id for c in found]

    async def _lost_pending(self) -> list[str]:
        """Pending runs nobody drove for a while: their wake was lost (Redis restart, crash).

        The scan walks a finite cycle (up to the tail read at its start) with a
        cursor, so each run is dispatched once per cycle however long the backlog.
        """
        sweeps = self._store.sweeps
        older = self._settings.stale_after_ms * 2
        if self._pending_through is None:
            # A new cycle at most once per `older`: a backlog that merely waits for free
            # slots must not collect a duplicate wake every tick.
            if time.monotonic() - self._cycle_started < older / 1000:
                return []
            self._cycle_started = time.monotonic()
            self._pending_through = await sweeps.pending_tail(older_than_ms=older)
            self._pending_cursor = None
            if self._pending_through is None:
                return []
        found = await sweeps.pending_runs(
            older_than_ms=older,
            after=self._pending_cursor,
            through=self._pending_through,
            limit=self._batch,
        )
        if len(found) < self._batch:
            self._pending_through = None
        else:
            self._pending_cursor = found[-1]
        resumable = await sweeps.runnable_suspended(older_than_ms=older, limit=self._batch)
        return _unique([p.run_id for p in found] + resumable)


def _unique(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))
