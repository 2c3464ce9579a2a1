"""The sweeps (DESIGN §7): how runs that no message will ever mention get driven.

Every tick, each sweep kind takes a transaction-scoped advisory lock so normally
one worker of the fleet performs it (the CAS keeps overlapping sweeps correct
anyway), reads one batch strictly after the kind's cursor, stores the new cursor
in the same transaction, and dispatches each run: a wake message on its queue's
stream (the recovery lane for runs that already started), or — if Redis cannot
take it — a local drive. Sweeps only dispatch; the driver decides.

Progress guarantee: a read that reaches the end of its keyset wraps around and
fills the batch from the start, and the next tick continues after the last row
read. So with N eligible rows and batch B, every row is dispatched at least once
every ceil(N / B) ticks of that kind, however many rows in front of it nobody can
take (a retired flow, a queue nobody reads, an owner the probe vouches for). The
cursor lives in Postgres, not in this process: whichever worker wins a tick's
lock continues where the previous winner stopped, so the bound holds fleet-wide.

No sweep is gated on another: each kind runs every tick. A failing sweep is
logged and tried again next tick (its cursor rolls back with it); one row that
cannot be processed (a clock or a deadline cancel that raises) is skipped, not
retried forever in front of the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from broker.service import Service, Signal
from store import Store, SweepKind
from store.config import Settings, jittered
from store.sweeps import START, Keyed, SweepCursor, SweepKey
from store.types import ClockRow, PendingCursor, RunRow
from worker import metrics

log = logging.getLogger("runfleet.worker.sweeper")

DispatchFn = Callable[[list[str], str], Awaitable[None]]
"""(run ids, reason) -> get those runs driven somewhere in the fleet."""

T = TypeVar("T")


@dataclass(frozen=True)
class SweeperSignals:
    """Points of the sweeper a test waits on instead of polling (``broker.service.Signal``)."""

    swept: Signal[None] = field(default_factory=Signal)
    """One tick ended: every kind was tried, and what each found was dispatched."""


class Sweeper(Service):
    """The sweeps as a service (``broker.service``): one tick every sweep interval, jittered.

    ``tick`` is one pass of every kind (tests call it directly).
    """

    name = "sweeper"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        dispatch: DispatchFn,
        *,
        signals: SweeperSignals | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._settings = settings
        self._dispatch = dispatch
        self._batch = settings.sweep_batch
        self._signals = signals

    async def _serve(self) -> None:
        interval = self._settings.sweep_interval
        while not self.stopping:
            await self.tick()
            await self._pause(jittered(interval))

    async def tick(self) -> None:
        for kind, sweep in (
            (SweepKind.STALE_RUNNING, self._stale_running),
            (SweepKind.PARKED, self._released),
            (SweepKind.RUNNABLE_SUSPENDED, self._runnable_suspended),
            (SweepKind.DUE_CLOCKS, self._due_clocks),
            (SweepKind.DUE_WAITS, self._due_waits),
            (SweepKind.DEADLINE_PASSED, self._deadline_passed),
            (SweepKind.PENDING_CANCELLATIONS, self._pending_cancellations),
            (SweepKind.LOST_PENDING, self._lost_pending),
        ):
            await self._one(kind, sweep)
        if self._signals is not None:
            self._signals.swept.fire(None)

    async def _one(self, kind: SweepKind, sweep: Callable[[], Awaitable[list[str]]]) -> None:
        started = time.monotonic()
        try:
            async with self._store.transaction():
                if not await self._store.sweeps.try_lock(kind):
                    return
                run_ids = _unique(await sweep())
        except Exception as exc:
            metrics.INFRA_ERRORS.labels(f"sweep:{kind.label}").inc()
            log.warning(
                "sweep.failed", extra={"kind": kind.name, "error": repr(exc)}, exc_info=True
            )
            return
        metrics.SWEEP_DURATION.labels(kind.label).observe(time.monotonic() - started)
        metrics.SWEEP_BATCH.labels(kind.label).observe(len(run_ids))
        if not run_ids:
            return
        log.debug("sweep.dispatch", extra={"kind": kind.name, "runs": len(run_ids)})
        try:
            await self._dispatch(run_ids, f"sweep:{kind.label}")
        except Exception as exc:
            log.warning("sweep.dispatch_failed", extra={"kind": kind.name, "error": repr(exc)})

    async def _walk(
        self,
        kind: SweepKind,
        read: Callable[[SweepKey, int], Awaitable[Sequence[T]]],
        key: Callable[[T], SweepKey],
    ) -> list[T]:
        """One batch after the kind's cursor, wrapping to the start at the end; saves the cursor.

        Called under the kind's lock, in the transaction that saves the new cursor,
        so two workers never walk the same stretch for the same tick.
        """
        cursor = await self._store.sweeps.cursor(kind)
        found = list(await read(cursor.after, self._batch))
        after = key(found[-1]) if len(found) == self._batch else START
        if len(found) < self._batch and cursor.after != START:
            # The end of the keyset: fill the batch from the start (rows before the cursor).
            wanted = self._batch - len(found)
            wrapped = await read(START, wanted)
            seen = {key(row) for row in found}
            found += [row for row in wrapped if key(row) not in seen]
            after = key(wrapped[-1]) if len(wrapped) == wanted else START
        if after != cursor.after:
            await self._store.sweeps.save_cursor(kind, cursor.at(after))
        return found

    # ---- the kinds -----------------------------------------------------------

    async def _stale_running(self) -> list[str]:
        """Running rows with a stale lease: the driver probes and steals (recovery lane)."""
        stale_after = self._settings.stale_after_ms

        async def read(after: SweepKey, limit: int) -> list[RunRow]:
            return await self._store.sweeps.stale_running(stale_after, limit, after=after)

        def key(row: RunRow) -> SweepKey:
            assert row.heartbeat_at_ms is not None  # running rows always have a lease
            return SweepKey(row.heartbeat_at_ms, row.id)

        rows = await self._walk(SweepKind.STALE_RUNNING, read, key)
        return [row.id for row in rows]

    async def _released(self) -> list[str]:
        """Runs released by a shutdown or a lapse (their direct wake may have been lost)."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.parked_released(after=after, limit=limit)

        return [k.run_id for k in await self._walk(SweepKind.PARKED, read, _key)]

    async def _runnable_suspended(self) -> list[str]:
        """Suspended runs whose wait was answered but whose wake was lost; every tick.

        Two sweep intervals of grace let the answer's own wake message arrive first;
        after that a duplicate wake is harmless (the claim is a CAS).
        """
        sweeps = self._store.sweeps
        older = self._settings.woken_grace_ms

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.runnable_suspended(older_than_ms=older, after=after, limit=limit)

        return [k.run_id for k in await self._walk(SweepKind.RUNNABLE_SUSPENDED, read, _key)]

    async def _due_clocks(self) -> list[str]:
        """Fire due clocks (each completes its deferred and may clear the run's wait)."""

        async def read(after: SweepKey, limit: int) -> list[ClockRow]:
            return await self._store.sweeps.due_clocks(after=after, limit=limit)

        clocks = await self._walk(
            SweepKind.DUE_CLOCKS, read, lambda c: SweepKey(c.due_at_ms, c.run_id, c.name)
        )
        fire = self._store.waits.complete_clock
        fired: list[str] = []
        for clock in clocks:
            if await self._each(
                "due_clocks", clock.run_id, partial(fire, clock.run_id, clock.name)
            ):
                fired.append(clock.run_id)
        return fired

    async def _due_waits(self) -> list[str]:
        """Timed waits (timers, event and approval timeouts, delayed admissions) now due."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.due_waits(after=after, limit=limit)

        return [k.run_id for k in await self._walk(SweepKind.DUE_WAITS, read, _key)]

    async def _deadline_passed(self) -> list[str]:
        """Cancel runs past their deadline through the ordinary cancel path."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.deadline_passed(after=after, limit=limit)

        cancel = partial(self._store.lifecycle.request_cancel, note="deadline", reason="deadline")
        requested: list[str] = []
        for row in await self._walk(SweepKind.DEADLINE_PASSED, read, _key):
            if await self._each("deadline_passed", row.run_id, partial(cancel, row.run_id)):
                requested.append(row.run_id)
        return requested

    async def _each(self, kind: str, run_id: str, work: Callable[[], Awaitable[object]]) -> bool:
        """One row's write in a savepoint: a row that raises is skipped, not retried first."""
        try:
            async with self._store.transaction():
                await work()
        except Exception as exc:
            metrics.INFRA_ERRORS.labels(f"sweep:{kind}").inc()
            log.warning(
                "sweep.row_failed", extra={"kind": kind, "run_id": run_id, "error": repr(exc)}
            )
            return False
        return True

    async def _pending_cancellations(self) -> list[str]:
        """Pending and parked runs a cancel reached: closed without a handler or a reader."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[PendingCursor]:
            return await sweeps.pending_cancellations(
                after=PendingCursor(after.id, after.ms), limit=limit
            )

        found = await self._walk(SweepKind.PENDING_CANCELLATIONS, read, _pending_key)
        return [c.run_id for c in found]

    async def _lost_pending(self) -> list[str]:
        """Pending runs nobody drove for a while: their wake was lost (Redis restart, crash).

        The scan walks a finite cycle (up to the tail read at its start) and starts a
        new cycle at most once per ``2 × stale_after`` of database time, so each run
        is dispatched once per cycle however long the backlog: a backlog that merely
        waits for free slots does not collect a duplicate wake every tick.
        """
        sweeps = self._store.sweeps
        older = self._settings.lost_pending_after_ms
        cursor = await sweeps.cursor(SweepKind.LOST_PENDING)
        if cursor.through is None:
            if (
                cursor.cycle_started_ms is not None
                and cursor.now_ms - cursor.cycle_started_ms < older
            ):
                return []
            tail = await sweeps.pending_tail(older_than_ms=older)
            cursor = SweepCursor(
                after=START,
                through=_pending_key(tail) if tail else None,
                cycle_started_ms=cursor.now_ms,
            )
            if tail is None:
                await sweeps.save_cursor(SweepKind.LOST_PENDING, cursor)
                return []
        assert cursor.through is not None
        found = await sweeps.pending_runs(
            older_than_ms=older,
            after=PendingCursor(cursor.after.id, cursor.after.ms),
            through=PendingCursor(cursor.through.id, cursor.through.ms),
            limit=self._batch,
        )
        if len(found) < self._batch:
            cursor = SweepCursor(cycle_started_ms=cursor.cycle_started_ms)  # cycle done
        else:
            cursor = cursor.at(_pending_key(found[-1]))
        await sweeps.save_cursor(SweepKind.LOST_PENDING, cursor)
        return [p.run_id for p in found]


def _key(row: Keyed) -> SweepKey:
    return row.key


def _pending_key(row: PendingCursor) -> SweepKey:
    return SweepKey(row.created_at_ms, row.run_id)


def _unique(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))
