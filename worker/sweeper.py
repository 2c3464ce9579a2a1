"""The sweeps (DESIGN §7): how runs that no message will ever mention get driven.

Every tick, each sweep kind takes a transaction-scoped lease (its row of
``runfleet.sweep_leases``, which only the worker role may lock) so normally
one worker of the fleet performs it (the CAS keeps overlapping sweeps correct
anyway), reads one batch strictly after the kind's cursor and commits; then it
dispatches each run: a wake message on its queue's stream (the recovery lane for runs
that already started), or — if Redis cannot take it — a local drive. Sweeps only
dispatch; the driver decides. Only then, under the lock again, the cursor advances,
and only past the rows dispatched (the longest dispatched prefix of the batch, in
keyset order): a dispatch that fails leaves its rows to the next tick instead of
skipping them for a whole cycle. The dispatch comes after the commit so that a wake
never names a state a reader cannot see yet.

Progress guarantee: a read that reaches the end of its keyset wraps around and
fills the batch from the start, and the next tick continues after the last row
dispatched. So with N eligible rows and batch B, every row is dispatched at least once
every ceil(N / B) ticks of that kind while dispatching works, however many rows in
front of it nobody can take (a retired flow, a queue nobody reads, an owner the probe
vouches for: their wakes are dispatched, the driver leaves them). The cursor lives in
Postgres, not in this process: whichever worker wins a tick's lock continues where the
previous winner stopped, so the bound holds fleet-wide. A cursor moves only if it is
still where its tick read it (another worker may have advanced it meanwhile).

No sweep is gated on another: each kind runs every tick. A failing sweep is
logged and tried again next tick (its cursor stays); one row that cannot be processed
(a clock or a deadline cancel that raises) is skipped, not retried forever in front of
the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar, assert_never

import runfleet.worker.metrics as metrics
from runfleet.broker.wake_reasons import WakeReason
from runfleet.runtime.service import Service, Signal
from runfleet.store import Store, SweepKind
from runfleet.store.config import Settings, jittered
from runfleet.store.sweeps import (
    MIN_KEY,
    START,
    Keyed,
    LockHeld,
    RowFailed,
    RowWritten,
    SweepCursor,
    SweepKey,
    Swept,
)
from runfleet.store.types import ClockRow, PendingCursor, RunRow
from runfleet.worker.statistics import StatisticsRefresh
from runfleet.worker.wake_marks import WakeMarks

log = logging.getLogger("runfleet.worker.sweeper")

DispatchFn = Callable[[list[str], WakeReason], Awaitable[Collection[str]]]
"""(run ids, reason) -> get those runs driven somewhere in the fleet; the ids dispatched."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Find:
    """One row a sweep read: its place in the keyset, and the run to dispatch (None: the
    row needs no dispatch, e.g. a clock whose firing failed and is skipped)."""

    key: SweepKey
    run_id: str | None


@dataclass(frozen=True)
class Finds:
    """What one tick of a kind read, in walk order, and where its cursor may go."""

    read: SweepCursor
    """The cursor as the tick read it: it moves only if it is still this."""
    base: SweepCursor
    """Where the cursor goes if nothing was dispatched (``read``, or a new cycle's start)."""
    rows: list[Find]
    done: SweepCursor
    """Where the cursor goes once every row was dispatched."""
    after_dispatch: Callable[[list[str]], Awaitable[None]] | None = None
    """What the kind records about the runs it dispatched (lost-pending: their new wake)."""

    @property
    def run_ids(self) -> list[str]:
        return _unique([row.run_id for row in self.rows if row.run_id is not None])

    def advanced(self, dispatched: Collection[str]) -> SweepCursor:
        """The cursor past the longest prefix of rows dispatched (or needing none)."""
        for i, row in enumerate(self.rows):
            if row.run_id is not None and row.run_id not in dispatched:
                return self.base.at(self.rows[i - 1].key) if i else self.base
        return self.done


@dataclass(frozen=True)
class SweeperSignals:
    """Points of the sweeper a test waits on instead of polling (``runtime.service.Signal``)."""

    swept: Signal[None] = field(default_factory=Signal)
    """One tick ended: every kind was tried, and what each found was dispatched."""


class Sweeper(Service):
    """The sweeps as a service (``runtime.service``): one tick every sweep interval, jittered.

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
        marks: WakeMarks | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._settings = settings
        self._dispatch = dispatch
        self._batch = settings.sweep_batch
        self._signals = signals
        self._marks = marks
        self._statistics = StatisticsRefresh(store) if settings.refresh_statistics else None
        """The planner's statistics kept up with the tables' growth (None: autovacuum's)."""
        """This worker's view of its queues' streams (None: it reads none, and the
        lost-pending sweep goes by the marks other workers wrote)."""

    async def _serve(self) -> None:
        interval = self._settings.sweep_interval
        while not self.stopping:
            await self.tick()
            await self._pause(jittered(interval))

    async def tick(self) -> None:
        if self._marks is not None:
            await self._marks.sample()
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
        if self._statistics is not None:
            await self._statistics.tick()
        if self._signals is not None:
            self._signals.swept.fire(None)

    async def _one(self, kind: SweepKind, sweep: Callable[[], Awaitable[Finds]]) -> None:
        started = time.monotonic()
        try:
            ticked = await self._store.sweeps.locked(kind, sweep)
        except Exception as exc:
            metrics.INFRA_ERRORS.labels(f"sweep:{kind.label}").inc()
            log.warning(
                "sweep.failed", extra={"kind": kind.name, "error": repr(exc)}, exc_info=True
            )
            return
        match ticked:
            case LockHeld():
                return
            case Swept(found=finds):
                pass
            case _:
                assert_never(ticked)
        metrics.SWEEP_DURATION.labels(kind.label).observe(time.monotonic() - started)
        run_ids = finds.run_ids
        metrics.SWEEP_BATCH.labels(kind.label).observe(len(run_ids))
        dispatched: Collection[str] = ()
        if run_ids:
            log.debug("sweep.dispatch", extra={"kind": kind.name, "runs": len(run_ids)})
            try:
                dispatched = await self._dispatch(run_ids, WakeReason.of_sweep(kind))
            except Exception as exc:
                log.warning("sweep.dispatch_failed", extra={"kind": kind.name, "error": repr(exc)})
        if dispatched and finds.after_dispatch is not None:
            try:
                await finds.after_dispatch(sorted(dispatched))
            except Exception as exc:  # a later cycle may then wake them early: duplicates only
                metrics.INFRA_ERRORS.labels(f"sweep:{kind.label}").inc()
                log.warning("sweep.record_failed", extra={"kind": kind.name, "error": repr(exc)})
        await self._advance(kind, finds, finds.advanced(dispatched))

    async def _advance(self, kind: SweepKind, finds: Finds, cursor: SweepCursor) -> None:
        """Move the kind's cursor, under its lock, if it is still where this tick read it.

        Another worker may hold the lock now (it read the same stretch: it moves the
        cursor itself) or may have moved it since (this tick's rows were then its too).
        """
        if cursor == finds.read:
            return
        try:
            await self._store.sweeps.advance_locked(kind, finds.read, cursor)
        except Exception as exc:  # the next tick reads this stretch again: duplicates only
            metrics.INFRA_ERRORS.labels(f"sweep:{kind.label}").inc()
            log.warning("sweep.cursor_failed", extra={"kind": kind.name, "error": repr(exc)})

    async def _walk(
        self,
        kind: SweepKind,
        read: Callable[[SweepKey, int], Awaitable[Sequence[T]]],
        key: Callable[[T], SweepKey],
        run_of: Callable[[T], str | None],
    ) -> Finds:
        """One batch after the kind's cursor, wrapping to the start at the end.

        Called under the kind's lock; the cursor moves after the dispatch (``_advance``).
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
        return Finds(
            read=cursor,
            base=cursor,
            rows=[Find(key(row), run_of(row)) for row in found],
            done=cursor.at(after),
        )

    # ---- the kinds -----------------------------------------------------------

    async def _stale_running(self) -> Finds:
        """Running rows with a stale lease: the driver probes and steals (recovery lane)."""
        stale_after = self._settings.stale_after_ms

        async def read(after: SweepKey, limit: int) -> list[RunRow]:
            return await self._store.sweeps.stale_running(stale_after, limit, after=after)

        def key(row: RunRow) -> SweepKey:
            assert row.heartbeat_at_ms is not None  # running rows always have a lease
            return SweepKey(row.heartbeat_at_ms, row.id)

        return await self._walk(SweepKind.STALE_RUNNING, read, key, lambda row: row.id)

    async def _released(self) -> Finds:
        """Runs released by a shutdown or a lapse (their direct wake may have been lost)."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.parked_released(after=after, limit=limit)

        return await self._walk(SweepKind.PARKED, read, _key, _run)

    async def _runnable_suspended(self) -> Finds:
        """Suspended runs whose wait was answered but whose wake was lost; every tick.

        Two sweep intervals of grace let the answer's own wake message arrive first;
        after that a duplicate wake is harmless (the claim is a CAS).
        """
        sweeps = self._store.sweeps
        older = self._settings.woken_grace_ms

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.runnable_suspended(older_than_ms=older, after=after, limit=limit)

        return await self._walk(SweepKind.RUNNABLE_SUSPENDED, read, _key, _run)

    async def _due_clocks(self) -> Finds:
        """Fire due clocks (each completes its deferred and may clear the run's wait)."""

        async def read(after: SweepKey, limit: int) -> list[ClockRow]:
            return await self._store.sweeps.due_clocks(after=after, limit=limit)

        finds = await self._walk(
            SweepKind.DUE_CLOCKS,
            read,
            lambda c: SweepKey(c.due_at_ms, c.run_id, c.name),
            lambda c: c.run_id,
        )
        fire = self._store.waits.complete_clock
        rows: list[Find] = []
        for row in finds.rows:
            assert row.run_id is not None
            work = partial(fire, row.run_id, row.key.name)
            fired = await self._each("due_clocks", row.run_id, work)
            rows.append(row if fired else Find(row.key, None))  # a failed one is skipped
        return replace(finds, rows=rows)

    async def _due_waits(self) -> Finds:
        """Timed waits (timers, event and approval timeouts, delayed admissions) now due."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.due_waits(after=after, limit=limit)

        return await self._walk(SweepKind.DUE_WAITS, read, _key, _run)

    async def _deadline_passed(self) -> Finds:
        """Cancel runs past their deadline through the ordinary cancel path."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[Keyed]:
            return await sweeps.deadline_passed(after=after, limit=limit)

        cancel = partial(self._store.lifecycle.request_cancel, note="deadline", reason="deadline")
        finds = await self._walk(SweepKind.DEADLINE_PASSED, read, _key, _run)
        rows: list[Find] = []
        for row in finds.rows:
            assert row.run_id is not None
            requested = await self._each("deadline_passed", row.run_id, partial(cancel, row.run_id))
            rows.append(row if requested else Find(row.key, None))  # a failed one is skipped
        return replace(finds, rows=rows)

    async def _each(self, kind: str, run_id: str, work: Callable[[], Awaitable[object]]) -> bool:
        """One row's write in a savepoint: a row that raises is skipped, not retried first."""
        match await self._store.sweeps.each_row(work):
            case RowWritten():
                return True
            case RowFailed(error=exc):
                metrics.INFRA_ERRORS.labels(f"sweep:{kind}").inc()
                log.warning(
                    "sweep.row_failed", extra={"kind": kind, "run_id": run_id, "error": repr(exc)}
                )
                return False

    async def _pending_cancellations(self) -> Finds:
        """Pending and parked runs a cancel reached: closed without a handler or a reader."""
        sweeps = self._store.sweeps

        async def read(after: SweepKey, limit: int) -> list[PendingCursor]:
            return await sweeps.pending_cancellations(
                after=PendingCursor(after.id, after.ms), limit=limit
            )

        return await self._walk(
            SweepKind.PENDING_CANCELLATIONS, read, _pending_key, lambda c: c.run_id
        )

    async def _lost_pending(self) -> Finds:
        """Never-started pending runs whose wake no reader will deliver (``worker.wake_marks``):
        admitted before their queue's wake mark and still pending and unclaimed.

        A deep backlog that merely waits for free slots is admitted after every mark its
        readers reached, so it is never re-woken. A run this sweep wakes is recorded as
        written then (``redispatched``), so it counts as lost again only once the mark
        passes that new wake too, however deep the stream it waits in. The scan walks a
        finite cycle (up to the tail read at its start), ``lost_pending_batch`` runs a
        tick, and starts a new cycle at most once per ``lost_pending_after_ms`` of
        database time, so a run a reader was handed and left (a flow this fleet does not
        know yet, a limit) is woken at most once per cycle.
        """
        sweeps = self._store.sweeps
        read = cursor = await sweeps.cursor(SweepKind.LOST_PENDING)
        fallback = (
            self._marks.fallback_before_ms(cursor.now_ms) if self._marks is not None else MIN_KEY
        )
        if cursor.through is None:
            if (
                cursor.cycle_started_ms is not None
                and cursor.now_ms - cursor.cycle_started_ms < self._settings.lost_pending_after_ms
            ):
                return Finds(read=read, base=read, rows=[], done=read)
            tail = await sweeps.lost_pending_tail(fallback_before_ms=fallback)
            cursor = SweepCursor(
                after=START,
                through=_pending_key(tail) if tail else None,
                cycle_started_ms=cursor.now_ms,
                now_ms=cursor.now_ms,
            )
            if tail is None:  # nothing to scan: the cycle is over as soon as it began
                return Finds(read=read, base=cursor, rows=[], done=cursor)
        assert cursor.through is not None
        batch = self._settings.lost_pending_batch
        found = await sweeps.lost_pending(
            after=PendingCursor(cursor.after.id, cursor.after.ms),
            through=PendingCursor(cursor.through.id, cursor.through.ms),
            fallback_before_ms=fallback,
            limit=batch,
        )
        if len(found) < batch:
            done = SweepCursor(cycle_started_ms=cursor.cycle_started_ms, now_ms=cursor.now_ms)
        else:
            done = cursor.at(_pending_key(found[-1]))
        rows = [Find(_pending_key(p), p.run_id) for p in found]
        return Finds(
            read=read, base=cursor, rows=rows, done=done, after_dispatch=sweeps.redispatched
        )


def _key(row: Keyed) -> SweepKey:
    return row.key


def _run(row: Keyed) -> str:
    return row.run_id


def _pending_key(row: PendingCursor) -> SweepKey:
    return SweepKey(row.created_at_ms, row.run_id)


def _unique(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))
