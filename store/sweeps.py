"""The bounded, keyset-cursor reads the sweeps drive, their cursors, and the per-kind lease.

Each read returns rows strictly after a ``SweepCursor`` in its keyset order; once it
has dispatched them, the sweeper stores the last key it dispatched in
``runfleet.sweep_cursors`` under the kind's lease (``advance_cursor``: only if
the cursor is still where its tick read it), so whichever worker wins the next
tick continues from there (a cursor kept in one process would be skipped whenever
another process won the tick). Rows nobody can take therefore cost one batch slot
per cycle, never the whole batch every tick.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from runfleet.store.config import Settings
from runfleet.store.db import Database
from runfleet.store.rows import clock_row, run_row
from runfleet.store.types.run import Owner, PendingCursor, RunRow
from runfleet.store.types.waits import ClockRow

T = TypeVar("T")

MIN_KEY = -(2**63)
"""The smallest bigint: every keyset starts strictly after it."""
MAX_KEY = 2**63 - 1
"""The largest bigint: the upper bound of an unbounded scan (kept sargable, never NULL)."""


class SweepKind(enum.IntEnum):
    """A sweep kind: its row of ``runfleet.sweep_leases`` (the value) and its cursor (the name)."""

    PARKED = 1  # runs parked `released` (parked-cancelled are PENDING_CANCELLATIONS' rows)
    STALE_RUNNING = 2
    DUE_CLOCKS = 3
    PENDING_CANCELLATIONS = 4
    LOST_PENDING = 5
    DUE_WAITS = 6
    DEADLINE_PASSED = 7
    RUNNABLE_SUSPENDED = 8

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class SweepKey:
    """A position in a sweep's keyset: (time key, run id[, clock name])."""

    ms: int = MIN_KEY
    id: str = ""
    name: str = ""


START = SweepKey()


@dataclass(frozen=True, slots=True)
class SweepCursor:
    """Where a sweep kind stopped; ``through`` bounds a finite cycle (lost-pending only)."""

    after: SweepKey = START
    through: SweepKey | None = None
    cycle_started_ms: int | None = None
    now_ms: int = 0

    def at(self, after: SweepKey) -> SweepCursor:
        return replace(self, after=after)


@dataclass(frozen=True, slots=True)
class Keyed:
    """A run a sweep read, with its position in that sweep's keyset."""

    run_id: str
    key: SweepKey


@dataclass(frozen=True, slots=True)
class Swept(Generic[T]):
    """The sweep ran in its tick's transaction under the kind's lock; ``found`` is its answer."""

    found: T


@dataclass(frozen=True, slots=True)
class LockHeld:
    """Another worker holds this tick's lock for the kind: it sweeps, this one does not."""


LOCK_HELD = LockHeld()


class CursorAdvance(enum.StrEnum):
    """What ``Sweeps.advance_locked`` did with a tick's new cursor."""

    ADVANCED = "advanced"
    """Stored: the cursor was still where this tick read it."""
    MOVED = "moved"
    """Another tick moved it meanwhile (this tick's rows were its rows too): left."""
    LOCK_HELD = "lock_held"
    """Another worker holds the kind's lock now (it read the same stretch): left to it."""


@dataclass(frozen=True, slots=True)
class RowWritten:
    """One row's sweep write committed (in its savepoint)."""


@dataclass(frozen=True, slots=True)
class RowFailed:
    """One row's sweep write raised and was rolled back alone; the sweep goes on."""

    error: Exception


ROW_WRITTEN = RowWritten()


@dataclass(frozen=True, slots=True)
class Analyzed:
    """A table whose statistics ``Sweeps.analyze_grown`` refreshed: the rows Postgres had
    counted (what cached plans were made from) and its committed rows when analyzed."""

    table: str
    rows_counted: int
    rows_now: int


class Sweeps:
    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._settings = settings

    # ---- the decisions a sweep tick takes (the sweeper opens no transaction) -----

    async def locked(
        self, kind: SweepKind, sweep: Callable[[], Awaitable[T]]
    ) -> Swept[T] | LockHeld:
        """Run one tick of ``kind``: ``sweep`` in one transaction, under the kind's lock.

        Only one worker's tick reads (and writes for) a kind at a time; the others answer
        ``LockHeld`` at once. The lock is transaction-scoped: released when ``sweep``
        returns or raises, and when the connection dies (``try_lock``).
        """
        async with self._db.transaction():
            if not await self.try_lock(kind):
                return LOCK_HELD
            return Swept(await sweep())

    async def advance_locked(
        self, kind: SweepKind, expected: SweepCursor, cursor: SweepCursor
    ) -> CursorAdvance:
        """Move the kind's cursor to ``cursor``, under its lock, if still at ``expected``."""
        async with self._db.transaction():
            if not await self.try_lock(kind):
                return CursorAdvance.LOCK_HELD
            if await self.advance_cursor(kind, expected, cursor):
                return CursorAdvance.ADVANCED
            return CursorAdvance.MOVED

    async def each_row(self, write: Callable[[], Awaitable[object]]) -> RowWritten | RowFailed:
        """One row's write of a sweep (a clock fired, a deadline's cancel) in its own
        savepoint within the tick's transaction: a row that raises rolls back alone and is
        skipped (``RowFailed``), so one bad row never aborts the tick nor blocks the rest."""
        try:
            async with self._db.transaction():
                await write()
        except Exception as exc:
            return RowFailed(exc)
        return ROW_WRITTEN

    async def try_lock(self, kind: SweepKind) -> bool:
        """Take this tick's lease of a sweep kind; only inside a transaction.

        The lease is the kind's row of ``runfleet.sweep_leases``, locked SKIP LOCKED: only
        the worker role may lock it (no producer or operator login can hold a sweep
        off). It is transaction-scoped, so it is released when the sweeper's transaction
        ends (including when its connection dies), and the transaction may not sit idle
        past ``Settings.sweep_lock_idle_ms``: a tick cut off from Postgres midway hands
        the kind back to the fleet within that bound. Its statements wait on a row lock
        at most ``Settings.worker_lock_wait_ms``.
        """
        params = {
            "kind": int(kind),
            "idle_ms": self._settings.sweep_lock_idle_ms,
            "lock_ms": self._settings.worker_lock_wait_ms,
        }
        row = await self._db.one("sweeps.try_sweep_lock", params)
        return bool(row and row["locked"])

    # ---- cursors -----------------------------------------------------------

    async def cursor(self, kind: SweepKind) -> SweepCursor:
        """The kind's cursor (the start if it has none) and the database time now."""
        row = await self._db.one("sweeps.cursor_get", {"kind": kind.label})
        assert row is not None, "cursor_get always answers one row"
        now_ms = int(row["now_ms"])
        if row["after_ms"] is None:
            return SweepCursor(now_ms=now_ms)
        through = (
            SweepKey(int(row["through_ms"]), row["through_id"])
            if row["through_ms"] is not None
            else None
        )
        return SweepCursor(
            after=SweepKey(int(row["after_ms"]), row["after_id"], row["after_name"]),
            through=through,
            cycle_started_ms=row["cycle_started_ms"],
            now_ms=now_ms,
        )

    async def save_cursor(self, kind: SweepKind, cursor: SweepCursor) -> None:
        """Store where the kind stopped; call in the transaction holding its lock."""
        await self._db.execute(
            "sweeps.cursor_put",
            {
                "kind": kind.label,
                "after_ms": cursor.after.ms,
                "after_id": cursor.after.id,
                "after_name": cursor.after.name,
                "through_ms": cursor.through.ms if cursor.through else None,
                "through_id": cursor.through.id if cursor.through else None,
                "cycle_started_ms": cursor.cycle_started_ms,
            },
        )

    async def advance_cursor(
        self, kind: SweepKind, expected: SweepCursor, cursor: SweepCursor
    ) -> bool:
        """Store ``cursor`` if the kind's cursor is still ``expected`` (where this tick read
        it); False if another tick moved it meanwhile. Call under the kind's lock: every
        cursor write holds it, so the read and the write here cannot be interleaved."""
        if not _same_place(await self.cursor(kind), expected):
            return False
        await self.save_cursor(kind, cursor)
        return True

    # ---- keyset reads ------------------------------------------------------

    async def _keyed(
        self, query: str, key_column: str, after: SweepKey, limit: int, **params: object
    ) -> list[Keyed]:
        rows = await self._db.all(
            query, {"after_ms": after.ms, "after_id": after.id, "limit": limit, **params}
        )
        return [Keyed(r["id"], SweepKey(int(r[key_column]), r["id"])) for r in rows]

    async def stale_running(
        self, stale_after_ms: int, limit: int = 64, *, after: SweepKey = START
    ) -> list[RunRow]:
        """Running rows whose lease is older than ``stale_after_ms`` by database time,
        stalest first, strictly after ``after`` in (heartbeat, id) order.

        The one stale-lease read: the stale sweep walks it batch by batch, ``runfleet
        fleet stuck`` reads its first page. Whole rows with ``now_ms``."""
        rows = await self._db.all(
            "sweeps.stale_running",
            {
                "stale_after_ms": stale_after_ms,
                "limit": limit,
                "after_ms": after.ms,
                "after_id": after.id,
            },
        )
        return [run_row(r) for r in rows]

    async def parked_released(self, *, after: SweepKey = START, limit: int = 64) -> list[Keyed]:
        """Runs parked ``released`` by a shutdown or a lapse, by release time."""
        return await self._keyed("sweeps.parked_released", "updated_at_ms", after, limit)

    async def due_waits(self, *, after: SweepKey = START, limit: int = 64) -> list[Keyed]:
        """Parked runs whose timed wait is due (quarantine excluded), earliest first."""
        return await self._keyed("sweeps.due_waits", "waiting_wake_at_ms", after, limit)

    async def due_clocks(self, *, after: SweepKey = START, limit: int = 64) -> list[ClockRow]:
        """Unfired clocks whose time has come, in (due, run, name) order."""
        rows = await self._db.all(
            "sweeps.due_clocks",
            {"after_ms": after.ms, "after_id": after.id, "after_name": after.name, "limit": limit},
        )
        return [clock_row(r) for r in rows]

    async def deadline_passed(self, *, after: SweepKey = START, limit: int = 64) -> list[Keyed]:
        """Unsettled runs past their deadline that no cancel has reached yet."""
        return await self._keyed("sweeps.deadline_passed", "deadline_ms", after, limit)

    async def runnable_suspended(
        self, *, older_than_ms: int, after: SweepKey = START, limit: int = 64
    ) -> list[Keyed]:
        """Suspended rows whose wait was cleared ``older_than_ms`` ago and nobody resumed."""
        return await self._keyed(
            "sweeps.runnable_suspended",
            "updated_at_ms",
            after,
            limit,
            older_than_ms=older_than_ms,
        )

    async def pending_runs(
        self,
        *,
        older_than_ms: int = 0,
        flow: str | None = None,
        after: PendingCursor | None = None,
        through: PendingCursor | None = None,
        limit: int = 64,
    ) -> list[PendingCursor]:
        """Runnable pending admissions, oldest first, strictly after ``after``."""
        rows = await self._db.all(
            "sweeps.pending_runs",
            {
                "older_than_ms": older_than_ms,
                "flow": flow,
                "after_ms": after.created_at_ms if after else MIN_KEY,
                "after_id": after.run_id if after else "",
                "through_ms": through.created_at_ms if through else MAX_KEY,
                "through_id": through.run_id if through else "",
                "limit": limit,
            },
        )
        return [PendingCursor(r["id"], int(r["created_at_ms"])) for r in rows]

    async def pending_tail(
        self, *, older_than_ms: int = 0, flow: str | None = None
    ) -> PendingCursor | None:
        """The newest eligible pending admission: bounds one finite scan cycle."""
        row = await self._db.one(
            "sweeps.pending_tail", {"older_than_ms": older_than_ms, "flow": flow}
        )
        return PendingCursor(row["id"], int(row["created_at_ms"])) if row else None

    async def lost_pending(
        self,
        *,
        after: PendingCursor | None = None,
        through: PendingCursor | None = None,
        fallback_before_ms: int = MIN_KEY,
        limit: int = 64,
    ) -> list[PendingCursor]:
        """Never-started pending runs whose wake is lost, oldest first, after ``after``.

        Lost: admitted (and last written) before the queue's wake mark, or before
        ``fallback_before_ms`` (an age bound for a worker that cannot reach Redis).
        """
        before = await self._lost_before(fallback_before_ms)
        if before is None:
            return []
        rows = await self._db.all(
            "sweeps.lost_pending",
            {
                "before_ms": before,
                "fallback_before_ms": fallback_before_ms,
                "after_ms": after.created_at_ms if after else MIN_KEY,
                "after_id": after.run_id if after else "",
                "through_ms": through.created_at_ms if through else MAX_KEY,
                "through_id": through.run_id if through else "",
                "limit": limit,
            },
        )
        return [PendingCursor(r["id"], int(r["created_at_ms"])) for r in rows]

    async def lost_pending_tail(self, *, fallback_before_ms: int = MIN_KEY) -> PendingCursor | None:
        """The newest run ``lost_pending`` answers now: bounds one finite scan cycle."""
        before = await self._lost_before(fallback_before_ms)
        if before is None:
            return None
        row = await self._db.one(
            "sweeps.lost_pending_tail",
            {"before_ms": before, "fallback_before_ms": fallback_before_ms},
        )
        return PendingCursor(row["id"], int(row["created_at_ms"])) if row else None

    async def _lost_before(self, fallback_before_ms: int) -> int | None:
        """The end of the lost-pending index range: the largest mark or the fallback."""
        before = max([*(await self.wake_marks()).values(), fallback_before_ms])
        return None if before <= MIN_KEY else before

    async def redispatched(self, run_ids: list[str]) -> None:
        """Record that the lost-pending sweep woke these never-started runs just now."""
        await self._db.execute("sweeps.lost_pending_redispatched", {"ids": run_ids})

    async def advance_wake_mark(self, queue: str, through_ms: int) -> None:
        """Move ``queue``'s wake mark to ``through_ms`` (database time) if that is later."""
        await self._db.execute(
            "sweeps.wake_mark_advance", {"queue": queue, "through_ms": through_ms}
        )

    async def wake_marks(self) -> dict[str, int]:
        """Every queue's wake mark (database time), by queue."""
        rows = await self._db.all("sweeps.wake_marks", {})
        return {r["queue"]: int(r["delivered_through_ms"]) for r in rows}

    async def pending_cancellations(
        self, *, after: PendingCursor | None = None, limit: int = 64
    ) -> list[PendingCursor]:
        """Pending and parked runs with a cancel request (nobody executes them)."""
        rows = await self._db.all(
            "sweeps.pending_cancellations",
            {
                "after_ms": after.created_at_ms if after else MIN_KEY,
                "after_id": after.run_id if after else "",
                "limit": limit,
            },
        )
        return [PendingCursor(r["id"], int(r["created_at_ms"])) for r in rows]

    async def analyze_grown(self) -> list[Analyzed]:
        """ANALYZE the runfleet table whose committed rows grew most, if they at least
        doubled since Postgres last counted them (``runfleet.analyze_grown``, migration
        0025): a plan a connection cached while the table was young is made again from
        the new statistics. Empty when nothing grew that much, or another process of the
        fleet is doing it."""
        rows = await self._db.all("sweeps.analyze_grown")
        return [
            Analyzed(str(r["table_name"]), int(r["rows_counted"]), int(r["rows_now"])) for r in rows
        ]

    async def stranded_claims(
        self, stale_after_ms: int, limit: int = 64
    ) -> list[tuple[str, Owner, int]]:
        rows = await self._db.all(
            "sweeps.stranded_claims", {"stale_after_ms": stale_after_ms, "limit": limit}
        )
        return [
            (
                r["id"],
                Owner(r["claim_host"], int(r["claim_pid"]), r["claim_nonce"]),
                int(r["claimed_at_ms"]),
            )
            for r in rows
        ]


def _same_place(a: SweepCursor, b: SweepCursor) -> bool:
    """The same stored cursor (the database time each was read at aside)."""
    return (a.after, a.through, a.cycle_started_ms) == (b.after, b.through, b.cycle_started_ms)
